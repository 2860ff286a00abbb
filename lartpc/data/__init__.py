"""Event storage and loading.

The loaders' own options are declared here (config's data.* settings take their allowed
values from this list): the loader that fills a batch, training-time augmentation
(:mod:`.augment`), turning each event to its start (:mod:`.orient`), Blosc's byte
shuffle (:mod:`.blosc_cache`) and where a sparse model's rulebooks are built.
"""

from lartpc.data.store import Event, EventStore, EventStoreError, write_shard

#: blosc (the study's: Blosc-compressed dense images in memory) | sparse (coordinates and
#: values, SCNet's input) | device-dense (the dense image built on the device from sparse)
LOADERS = ("blosc", "sparse", "device-dense")
AUGMENTS = ("none", "mirror")
ORIENTS = ("none", "start")
BLOSC_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")
#: Blosc's lossless general-purpose codecs (lartpc/data/blosc_cache.py measures them)
BLOSC_CODECS = ("blosclz", "lz4", "lz4hc", "zlib", "zstd")
#: when the blosc loader compresses its shard: start (before the first batch, inside the
#: data loading time: the paper) | first-epoch (each event as epoch 0 first uses it, in
#: the prefetch thread, overlapped with training: lartpc/data/blosc_cache.py)
BLOSC_COMPRESS_AT = ("first-epoch", "start")
#: forward (the model builds them: spconv in each layer's forward, or the torch layers'
#: index tables) | loader (the sparse loader's prefetch thread builds them for the next
#: batch: lartpc/models/rulebooks.py, lartpc/models/sparse_torch.py) | auto (loader for
#: SCNet's torch layers where it can serve them, forward otherwise: train/parts.py)
RULEBOOKS = ("auto", "forward", "loader")

__all__ = ["AUGMENTS", "BLOSC_CODECS", "BLOSC_COMPRESS_AT", "BLOSC_SHUFFLES", "LOADERS", "ORIENTS",
           "RULEBOOKS", "Event", "EventStore", "EventStoreError", "write_shard"]
