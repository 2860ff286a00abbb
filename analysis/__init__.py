"""Torch-free analysis of run folders: power-law fits of time-to-loss and epoch rate
against GPU count, training curves, confusion reports (``python -m lartpc.analysis``).

Needs only numpy, scipy, pandas and matplotlib; never imports torch, spconv or Horovod,
nor the training package.
"""

from lartpc.analysis.runs import CLASSES, Run, RunFolderError, load_run, load_runs

__all__ = ["CLASSES", "Run", "RunFolderError", "load_run", "load_runs"]
