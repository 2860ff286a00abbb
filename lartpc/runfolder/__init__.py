"""The run folder, torch-free: shared by training and analysis (see docs/run-folder.md)."""
