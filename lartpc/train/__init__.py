"""Training: run set-up and tear-down (:mod:`.run`), the parts a run drives
(:mod:`.parts`), the loop (:mod:`.loop`), evaluation, optimizer and learning-rate
schedule (:mod:`.optim`), checkpoints (:mod:`.checkpoint`); the run folder's tables and
provenance are :mod:`lartpc.runfolder`'s. Import the submodule you need; this package
imports nothing heavy.
"""
