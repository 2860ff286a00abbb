"""The paper's in-RAM dense store: each event's float32 image, Blosc-compressed.

The paper densified every event and Blosc-compressed the whole image at load time,
which is its "data loading time" (DLT). Two changes make that routine cheap without
changing what is kept (a Blosc-compressed dense image per event):

* images are compressed in bands of ``band_rows`` rows; a band with no hit is not
  compressed at all (Blosc would reduce it to a 32-byte zero chunk anyway) and is a
  ``memset`` on decompression, so load time scales with the rows a track crosses,
  not with the 51.8 MB image;
* one dense scratch image is reused: after compressing, only the pixels just written
  are set back to zero instead of clearing the whole image.

Default codec: LZ4, clevel 5, no shuffle, bands of 16 rows, chosen by measurement on
200 full-resolution generated events (~1800 hit pixels each): per-event time of
:meth:`BloscImageCache.add` and :meth:`decompress_into` (one thread, best of two, 2-core
shared box, image cache-resident); ``lartpc bench loader --compress-at start --codec C
--clevel L --shuffle S`` reproduces ``compress_s`` and the ratio:

============================  ===========  =============  ======
codec, level, shuffle         compress/ev  decompress/ev  ratio
============================  ===========  =============  ======
lz4 5 noshuffle (default)     1.7 ms       2.7 ms         1494
lz4 1 noshuffle               1.8 ms       3.2 ms         1314
blosclz 5 noshuffle           1.6 ms       2.8 ms         1475
lz4 5 shuffle                 2.1 ms       3.3 ms         1146
lz4 5 bitshuffle              2.9 ms       5.1 ms         789
zstd 1 noshuffle              3.0 ms       4.3 ms         3244
zstd 3 noshuffle              3.4 ms       4.2 ms         4119
zstd 1 bitshuffle             4.4 ms       7.7 ms         1466
============================  ===========  =============  ======

Shuffles cost time and ratio on these mostly-zero images (isolated float charges do
not line up bytewise); zstd halves the already tiny footprint (0.07 % of dense) at
~1.8x the compression time, which is the loading time. Even the fastest codec
compresses ~8x slower than the shard is read (0.2 ms/event), hence ``compress_at``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

import blosc2
import numpy as np

from lartpc.data import BLOSC_CODECS, BLOSC_COMPRESS_AT, BLOSC_SHUFFLES
from lartpc.data.store import Event
from lartpc.errors import ConfigError

log = logging.getLogger(__name__)

#: Blosc's filter for each of ``BLOSC_SHUFFLES``, in its order
_SHUFFLES = dict(zip(BLOSC_SHUFFLES, (blosc2.Filter.NOFILTER, blosc2.Filter.SHUFFLE,
                                      blosc2.Filter.BITSHUFFLE), strict=True))


@dataclass(frozen=True, slots=True, kw_only=True)
class BloscConfig:
    """Compression settings of the dense in-RAM store.

    Attributes
    ----------
    codec : Blosc codec name, one of ``BLOSC_CODECS`` (``blosclz``, ``lz4``, ``lz4hc``,
        ``zlib``, ``zstd``).
    clevel : compression level 0-9.
    shuffle : ``noshuffle``, ``shuffle`` or ``bitshuffle``.
    band_rows : rows per independently compressed band.
    threads : Blosc's own threads per compression call (0 = all cores). python-blosc2
        holds the GIL in ``compress2``/``decompress2`` (measured: a Python thread runs at
        3 % speed meanwhile), so Python threads cannot spread the work; Blosc's threads
        can, but on 16-row bands 2 threads were 3-4x slower than 1 here, hence 1.
    compress_at : ``start`` compresses the whole shard before the first batch (the
        paper); ``first-epoch`` compresses each event when epoch 0 first densifies it
        for a batch, in the prefetch thread, so the load is overlapped with training
        and the data loading time is little more than the read.
    """

    codec: str = "lz4"
    clevel: int = 5
    shuffle: str = "noshuffle"
    band_rows: int = 16
    threads: int = 1
    compress_at: str = "first-epoch"

    def cparams(self) -> blosc2.CParams:
        if self.codec not in BLOSC_CODECS:
            raise ConfigError(f"blosc codec {self.codec!r}: choose from "
                              f"{', '.join(BLOSC_CODECS)}")
        if self.shuffle not in BLOSC_SHUFFLES:
            raise ConfigError(f"blosc shuffle {self.shuffle!r}: choose from "
                              f"{', '.join(BLOSC_SHUFFLES)}")
        if not 0 <= self.clevel <= 9:
            raise ConfigError(f"blosc clevel {self.clevel}: must be 0..9")
        if self.compress_at not in BLOSC_COMPRESS_AT:
            raise ConfigError(f"blosc compress_at {self.compress_at!r}: "
                              f"{' or '.join(BLOSC_COMPRESS_AT)}")
        if self.band_rows < 1:
            raise ConfigError(f"blosc band_rows {self.band_rows}: must be >= 1")
        return blosc2.CParams(codec=blosc2.Codec[self.codec.upper()], clevel=self.clevel,
                              filters=[_SHUFFLES[self.shuffle]], typesize=4,
                              nthreads=self.n_threads())

    def n_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)


class BloscImageCache:
    """Blosc-compressed dense float32 images of a list of events, kept in RAM.

    Parameters
    ----------
    shape : (H, W) of the images.
    config : compression settings.
    """

    def __init__(self, shape: tuple[int, int], config: BloscConfig | None = None):
        self.shape = shape
        self.config = config or BloscConfig()
        # Plain dicts: blosc2 converts CParams/DParams with dataclasses.asdict on every
        # call, which cost more than compressing a band.
        self._cparams = dataclasses.asdict(self.config.cparams())
        self._dparams = dataclasses.asdict(blosc2.DParams(nthreads=1))
        # per event: (band, compressed) of its nonzero bands; None = not compressed yet
        self._chunks: list[list[tuple[int, bytes]] | None] = []
        self.compress_s = 0.0  # seconds spent compressing, wherever it happened

    def __len__(self) -> int:
        return len(self._chunks)

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more events, to be filled by :meth:`put`."""
        self._chunks.extend([None] * n)

    def has(self, i: int) -> bool:
        return self._chunks[i] is not None

    def put(self, i: int, image: np.ndarray, rows: np.ndarray) -> None:
        """Compress event ``i`` from its dense ``image``; ``rows`` are its hit rows."""
        t0 = time.perf_counter()
        self._chunks[i] = self._compress_bands(image, rows)
        self.compress_s += time.perf_counter() - t0

    @property
    def resident_bytes(self) -> int:
        """Bytes held by the compressed bands (plus 16 bytes of bookkeeping per band)."""
        return sum(len(c) + 16 for ev in self._chunks if ev for _, c in ev)

    @property
    def dense_bytes(self) -> int:
        """What the same events would take as dense float32."""
        return len(self) * self.shape[0] * self.shape[1] * 4

    @property
    def compression_ratio(self) -> float:
        return self.dense_bytes / max(self.resident_bytes, 1)

    def add(self, events: list[Event]) -> None:
        """Densify and compress ``events`` (appended in order) through one scratch image."""
        t0 = time.perf_counter()
        scratch = np.zeros(self.shape, np.float32)
        for ev in events:
            scratch[ev.row, ev.col] = ev.charge
            self._chunks.append(self._compress_bands(scratch, ev.row))
            scratch[ev.row, ev.col] = 0.0
        self.compress_s += time.perf_counter() - t0

    def _compress_bands(self, image: np.ndarray, rows: np.ndarray) -> list[tuple[int, bytes]]:
        band, h = self.config.band_rows, self.shape[0]
        return [(b, blosc2.compress2(image[b * band:min((b + 1) * band, h)], cparams=self._cparams))
                for b in np.unique(np.asarray(rows) // band).tolist()]

    def bands(self, i: int) -> list[int]:
        """Band numbers of event ``i``'s compressed (hit) bands, in increasing order."""
        if self._chunks[i] is None:
            raise KeyError(f"event {i} is not compressed yet")
        return [b for b, _ in self._chunks[i]]

    def clear_bands(self, dst: np.ndarray, bands) -> None:
        """Set the rows of ``bands`` in ``dst`` (H, W) to zero."""
        band, h = self.config.band_rows, self.shape[0]
        for b in bands:
            dst[b * band:min((b + 1) * band, h)] = 0.0

    def decompress_into(self, i: int, dst: np.ndarray, stale=None) -> list[int]:
        """Write event ``i``'s dense image into ``dst`` (C-contiguous float32 (H, W)).

        ``stale`` says which bands of ``dst`` may hold non-zeros: None for any (every
        band the event lacks is then zeroed, a 51.8 MB memset at full resolution), or
        the band numbers its previous image had; only those of them that this event
        lacks are zeroed. Returns this event's bands, the next call's ``stale``.
        """
        own = self.bands(i)
        band, h = self.config.band_rows, self.shape[0]
        if stale is None:
            row = 0  # rows below ``row`` are already written
            for b in own:
                dst[row:b * band] = 0.0
                row = min((b + 1) * band, h)
            dst[row:] = 0.0
        else:
            self.clear_bands(dst, set(stale).difference(own))
        for b, chunk in self._chunks[i]:
            blosc2.decompress2(chunk, dst=dst[b * band:min((b + 1) * band, h)],
                               dparams=self._dparams)
        return own
