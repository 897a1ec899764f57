"""What a run writes into a checkpoint (reading it back, and every resume check: ``resuming.py``).

The file format (one HDF5 file, every rank's arrays and JSON state, digests) is ``io/checkpoint.py``;
this module decides the content.  Per rank: ``params``, ``momentum``, ``buffers`` and the method's
arrays; the JSON ``state`` holds the loop's counters (``LoopState``), the method's scalars and the
straggler's generator.  Rank 0 adds the run's metadata (config, history, the last boundary
processed, the checkpoint generation).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..backend import to_numpy
from ..io import checkpoint as ckpt


@dataclass
class LoopState:
    """One rank's training-loop counters: what a resumed run continues from."""

    step: int = 0                  # local steps done
    local_epoch: int = 0           # epoch of this rank's data order
    step_in_epoch: int = 0
    local_samples: int = 0
    train_seconds: float = 0.0     # excluding phases (evaluations, checkpoints, waiting for them)
    eval_seconds: float = 0.0
    data_seconds: float = 0.0
    compute_seconds: float = 0.0   # step, exchange and update (timers of the method included)
    wall_seconds: float = 0.0      # as of the last checkpoint, earlier allocations included
    allocations: int = 1           # Slurm allocations (runs) this training has taken
    blas_threads: list | None = field(default_factory=list)   # [fewest, most] BLAS threads of a
    # rank in any allocation so far ([]: none recorded; None: an earlier one's are not known)

    def to_dict(self, **extra) -> dict:
        return {**asdict(self), **extra}

    @classmethod
    def from_dict(cls, d: dict) -> "LoopState":
        """Tolerates checkpoints of older versions (fields they did not have keep their defaults;
        their wall time is approximated by train + eval)."""
        st = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        if "wall_seconds" not in d:
            st.wall_seconds = st.train_seconds + st.eval_seconds
        if "blas_threads" not in d:
            st.blas_threads = None
        return st

    def add_blas_threads(self, fewest_most: tuple | None) -> None:
        """This allocation's (fewest, most) BLAS threads per rank (None: not recorded)."""
        if fewest_most is None or self.blas_threads is None:
            return
        seen = [*self.blas_threads, *fewest_most]
        self.blas_threads = [min(seen), max(seen)]

    def blas_summary(self) -> dict:
        """``summary.json``'s ``blas_threads``: the BLAS threads every rank of every allocation ran
        with (what ``--replay`` needs to redo the run's GEMMs bit for bit), or None with
        ``blas_threads_range`` [fewest, most] when they differed or an earlier allocation's are
        not known; nothing when not recorded."""
        bt = self.blas_threads
        if bt == []:
            return {}
        if bt is None:
            return {"blas_threads": None}
        if bt[0] == bt[1]:
            return {"blas_threads": bt[0]}
        return {"blas_threads": None, "blas_threads_range": bt}


def layout_signature(ps) -> str:
    """A short hash of the parameter layout (names and shapes): checkpoints fit only its model."""
    text = ";".join(f"{sp.name}:{sp.shape}" for sp in ps.layout.specs)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def save(s, run_dir: Path, loop: LoopState, history: list, boundary_done: int, extra: dict,
         reason: str) -> None:
    """Collective (inside a phase): every rank's state into one file (rank 0 writes), then keep
    the newest ``train.keep_checkpoints``.  ``s`` is the run's ``Setup``; ``extra``: more JSON
    state of this rank (the straggler's generator)."""
    m, ps, c = s.method, s.model.ps, s.control
    m.quiesce(ps)
    m.trace.record("checkpoint", reason=reason, boundary=boundary_done)
    m.trace.flush()
    g = int(c.max_over_ranks([m.global_samples])[0])
    arrays, scalars = m.state(ps)
    arrays = {"params": ps.params, "momentum": s.opt.momentum, "buffers": ps.buffers, **arrays}
    arrays = {k: to_numpy(v) for k, v in arrays.items()}
    state = json.dumps({"loop": loop.to_dict(global_samples=m.global_samples), "method": scalars,
                        "trace_lines": m.trace.lines, **extra})
    writer = None
    if s.topo.is_root:
        cfg = s.cfg
        meta = dict(config=cfg.to_dict(), method=m.name, ranks=s.topo.size, model=cfg.model.model,
                    num_params=s.model.num_params, layout=layout_signature(ps), global_samples=g,
                    boundary_done=boundary_done, ckpt_done=int(c.signals.seen[1]), reason=reason,
                    history=history, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
        writer = ckpt.Writer(ckpt.checkpoint_dir(run_dir), g, meta)
    try:
        c.funnel(arrays, state, writer.add_rank if writer else None)
        if writer:
            path = writer.commit()
            ckpt.prune(path.parent, s.cfg.train.keep_checkpoints)
            logging.getLogger("scalesgd").info("checkpoint %s (%s)", path, reason)
    except BaseException:
        if writer:
            writer.abort()
        raise
