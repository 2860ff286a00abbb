"""TOML presets: paper-* reproduce the study, tiny-* run in seconds on a laptop."""
