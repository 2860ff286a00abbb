"""Event storage and loading.

The loaders' own options are declared here (config's data.* settings take their allowed
values from this list): the loader that fills a batch, training-time augmentation
(:mod:`.augment`), turning each event to its start (:mod:`.orient`) and Blosc's byte
shuffle (:mod:`.blosc_cache`).
"""

from lartpc.data.store import Event, EventStore, EventStoreError, write_shard

#: blosc (the study's: Blosc-compressed dense images in memory) | sparse (coordinates and
#: values, SCNet's input) | device-dense (the dense image built on the device from sparse)
LOADERS = ("blosc", "sparse", "device-dense")
AUGMENTS = ("none", "mirror")
ORIENTS = ("none", "start")
BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")

__all__ = ["AUGMENTS", "BLOSC_SHUFFLES", "LOADERS", "ORIENTS", "Event", "EventStore",
           "EventStoreError", "write_shard"]
