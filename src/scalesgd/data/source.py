"""The external source of a DALI input pipeline (``pipeline.py``): the callback that reads a
Loader's samples from the HDF5 shards and draws their augmentation, and the ledger of samples
checked good or found bad.

DALI has no HDF5 reader, so ``Source`` (``fn.external_source``, batch mode) hands it each batch's
encoded bytes, labels and augmentation parameters.  DALI's decoder turns garbage compressed data
into noise without an error, so every sample is decoded strictly once (``validate.decode_problem``)
the first time a Loader meets it (``Ledger.check``); a bad one is replaced, deterministically, by the
next good global index and recorded with its reason (docs/data.md, "Bad input").
"""
from __future__ import annotations

import collections

import numpy as np

from .augment import AugmentSpec, draw, slice_args
from .shards import ShardSet
from .validate import decode_problem, header_size

# ----------------------------------------------------------------------------- checks
UNCHECKED, GOOD, BAD = 0, 1, 2     # ledger states; merging two ledgers is an element-wise max


class Ledger:
    """What one Loader knows about the samples of its split: ``state`` (n,) uint8 (UNCHECKED,
    GOOD: decoded strictly once, BAD: skipped), and the bad ones it found itself, in the order
    found, with the reason: ``found`` [(global index, reason)]. ``reported`` counts the entries
    of ``found`` already handed out by ``Loader.take_new_bad``."""

    def __init__(self, n: int):
        self.state = np.zeros(n, dtype=np.uint8)
        self.found: list[tuple[int, str]] = []
        self.reported = 0

    def is_bad(self, g: int) -> bool:
        return self.state[g] == BAD

    def check(self, g: int, data: np.ndarray) -> tuple[int, int] | None:
        """(width, height) of sample ``g`` if it is good, else None (and it is recorded bad).
        The strict decode runs only while ``g`` is UNCHECKED; later only the header is read."""
        if self.state[g] == GOOD:
            return header_size(data)
        problem = decode_problem(data)
        wh = None if problem else header_size(data)
        if wh is None:
            self.mark_found(g, problem or "no image size in the header")
        else:
            self.state[g] = GOOD
        return wh

    def mark_found(self, g: int, reason: str) -> None:
        if self.state[g] != BAD:
            self.state[g] = BAD
            self.found.append((g, reason))


# ----------------------------------------------------------------------------- callback
class Source:
    """External-source callback (batch mode, ``batch_info=True``): BatchInfo -> output lists.

    Outputs per sample: encoded bytes (nbytes,) uint8, label () int64 and, unless ``whole`` (ten-crop),
    the slice start/end (x, y) int32, resize roi start/end (y, x) float32, mirror () int32 and mean
    (3,) float32. Batch ``i`` of the pipeline's first epoch is batch ``start_step + i`` of
    ``first_epoch``. A sample that is known bad or fails its check (``Ledger.check``: a strict
    decode the first time, the header after) is replaced by the next good global index
    (deterministic) and recorded in the ledger. Raises only StopIteration: a failed HDF5 read is
    recorded in ``error`` and delivered as empty bytes, so the decoder fails and the Loader
    reports the recorded cause.
    """

    def __init__(self, shards: ShardSet, indices_of, batch_size: int, first_epoch: int,
                 start_step: int, spec: AugmentSpec, seed: int, ledger: Ledger, whole: bool):
        self.shards, self.indices_of, self.batch_size = shards, indices_of, batch_size
        self.first_epoch, self.start_step, self.spec, self.seed = first_epoch, start_step, spec, seed
        self.ledger, self.whole = ledger, whole                 # the ledger is the Loader's
        self.recent: collections.deque = collections.deque(maxlen=8)
        self.error: str | None = None
        self._cache: tuple[int, np.ndarray] | None = None

    def __call__(self, info):
        epoch = self.first_epoch + int(info.epoch_idx)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.indices_of(epoch))
        step = int(info.iteration) + (self.start_step if epoch == self.first_epoch else 0)
        batch = self._cache[1][step * self.batch_size:(step + 1) * self.batch_size]
        if batch.size == 0:
            raise StopIteration
        outs = [[] for _ in range(2 if self.whole else 8)]
        used = []
        for g in batch:
            j, data, wh = self._good_sample(int(g))
            used.append(j)
            outs[0].append(data)
            if not self.whole:
                p = draw(self.spec, self.seed, epoch, int(g), wh or (1, 1))
                for k, a in enumerate(slice_args(p.window, wh or (1, 1)), start=2):
                    outs[k].append(a)
                outs[6].append(p.mirror)
                outs[7].append(p.mean)
        used = np.array(used, dtype=np.int64)
        self.recent.append(used)
        # every output but the bytes is one dense array for the batch: DALI takes it in one copy
        # (a list of per-sample arrays costs a conversion each: ~40% of a small batch's time)
        outs[1] = self.shards.labels[used].astype(np.int64)
        if not self.whole:
            outs[2:6] = [np.stack(o) for o in outs[2:6]]
            outs[6] = np.array(outs[6], dtype=np.int32)
            outs[7] = np.stack(outs[7]).astype(np.float32, copy=False)
        return tuple(outs)

    def _good_sample(self, g: int):
        """(index actually used, bytes, (w, h) or None): ``g`` or the first good one after it."""
        n = self.shards.num_samples
        for k in range(n):
            j = (g + k) % n
            if self.ledger.is_bad(j):
                continue
            try:
                data = self.shards.read(j)[0]
            except Exception as e:                  # noqa: BLE001 - must not escape into DALI
                path, local = self.shards.locate(j)
                if self.error is None:
                    self.error = f"{path}[{local}]: cannot read sample ({' '.join(str(e).split())})"
                return j, np.zeros(0, dtype=np.uint8), None
            wh = self.ledger.check(j, data)
            if wh is not None:
                return j, data, wh
        self.error = self.error or f"{self.shards.root}/{self.shards.split}: no decodable sample left"
        return g, np.zeros(0, dtype=np.uint8), None
