"""lartpc: a sparse-versus-dense CNN scaling study on LArTPC event images."""

__version__ = "0.1.0"

#: Class names in the index order used everywhere (logs, confusion matrices, reports).
CLASSES: tuple[str, ...] = ("gamma", "electron", "muon", "pion", "kaon")
NUM_CLASSES = len(CLASSES)
