"""Training: run set-up and tear-down (:mod:`.run`), the parts a run drives
(:mod:`.parts`), the loop (:mod:`.loop`), evaluation, optimizer and learning-rate
schedule (:mod:`.optim`), checkpoints and the run-folder writers (:mod:`.runlog`,
:mod:`.runinfo`). Import the submodule you need; this package imports nothing heavy.
"""
