"""Bad samples met during training and evaluation: warned about once per job, counted once."""
from __future__ import annotations

import sys

import numpy as np


class BadSamples:
    """Undecodable or corrupt images the loaders skipped and replaced (``data/pipeline.py``)."""

    def __init__(self, comm, rank: int, train, val, train_samples: int):
        """``comm``: the run's transport; ``train``/``val``: this rank's loaders (None on a server
        rank); ``train_samples``: the size of the training split."""
        self.comm, self.rank = comm, rank
        self.train, self.val, self.train_samples = train, val, train_samples
        self.owned = 0             # distinct bad samples this rank warned about

    def report(self) -> int:
        """Collective, at each evaluation (every rank, server included): the ranks gather the ids
        of the samples they found since the last evaluation (int64 buffers); each distinct sample
        is warned about once per job, on stderr, by the lowest rank that found it, and counted by
        that rank.  Returns this rank's count so far: summed over the ranks it is the number of
        distinct bad samples met.  The ranks then merge which training samples they have checked
        (``Loader.merge_checks``): a sample is decoded strictly by one rank, not by each (unless
        two meet it between the same evaluations), and one found bad is skipped everywhere
        without a second warning."""
        rank, comm = self.rank, self.comm
        new = {sid: (where, why) for ld in (self.train, self.val) if ld is not None
               for sid, where, why in ld.take_new_bad()}
        ids, src = comm.allgather_int64(np.fromiter(new, np.int64, len(new)))
        uniq, first = np.unique(ids, return_index=True)     # rank order: first = lowest finder
        for sid in uniq[src[first] == rank].tolist():       # one write per line: lines of
            where, why = new[sid]                           # several ranks never interleave
            sys.stderr.write(f"scalesgd: warning: rank {rank}: skipped undecodable sample {where} "
                             f"({why}; replaced by the next good one)\n")
            sys.stderr.flush()
            self.owned += 1
        train = self.train
        checks = train.checks if train is not None else np.zeros(self.train_samples, np.uint8)
        checks = comm.allreduce_max_host(checks)
        if train is not None:
            train.merge_checks(checks)
        return self.owned

    def state(self) -> dict:
        """This rank's part for a checkpoint (JSON): its count and what its loaders know."""
        return {"owned": self.owned, **{split: ld.bad_state() for split, ld in
                                        (("train", self.train), ("val", self.val)) if ld is not None}}

    def restore(self, state: dict | None) -> None:
        """Continues from a checkpoint's ``state`` (None: one written before bad samples were
        saved; counting then restarts at 0, as it used to)."""
        if not state:
            return
        self.owned = int(state["owned"])
        for split, ld in (("train", self.train), ("val", self.val)):
            if ld is not None and split in state:
                ld.restore_bad(state[split])
