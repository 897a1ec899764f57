"""One rank's whole state (``RankState``), and where a rank's state comes from when the job's set
of ranks changes (``Origin``): one operation for the three ways that happens.

* **same**: a resume on the same ranks, split into the same nodes: every rank continues its own
  saved state, bit for bit;
* **reshape**: a resume on another rank count, or on the same ranks split into other node groups:
  each rank continues a saved rank (``resuming.source_rank``), with the replica its method asks
  for (``traits.reshape_replica``: the saved one, the saved replicas' average, or the server's
  center), at the saved global count;
* **survive**: a rank died (``train.on_failure = continue``): each survivor continues its own state
  on the shrunk job (``survive.py``), at the largest global count any survivor knew (all-reduce:
  rank 0's replica and count, since its replicas must stay identical).

The framework builds the ``Origin`` (``resuming.origin`` reads a checkpoint, ``survive.survive``
captures the survivor's state), then the method takes it in its codec's one hook ``adopt`` and the
loop in ``loop.Run.adopt``: nothing downstream branches on how the world changed except what the
state itself means (a push-sum weight renormalised after a death, a fresh exchange history after a
reshape).
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from ..backend import get_array_module, to_numpy
from ..io import checkpoint as ckpt
KINDS = ("same", "reshape", "survive")


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


@dataclass
class RankState:
    """Everything one rank continues from: its replica (``params``), optimizer momentum and BN
    statistics (``buffers``), host arrays; the method's further arrays (SlowMo's slow momentum,
    A-SGD's fetched weights, a pull read's copy) and JSON scalars (global count, timers, exchange
    counters, the gossip graph's generator, push-sum's weight, the rank's node group); the loop's
    counters; the straggler's generator state; the bad samples it counted; the trace lines up to it.
    A checkpoint holds one per rank (``to_record`` / ``read``)."""

    params: np.ndarray
    momentum: np.ndarray
    buffers: np.ndarray
    arrays: dict = field(default_factory=dict)
    method: dict = field(default_factory=dict)
    loop: LoopState = field(default_factory=LoopState)
    straggler: dict | None = None
    bad_samples: dict | None = None
    trace_lines: int | None = None

    @classmethod
    def of_run(cls, run, copies: bool = True) -> "RankState":
        """This rank's state now (``run``: a ``loop.Run``), on the host: after the codec's ``quiesce``
        (a checkpoint: ``copies=False``, the host views are written at once) or
        ``abandon`` (a survivor, before the shrink: copies, since the new job's start
        overwrites the live arrays)."""
        s = run.s
        ps, m = s.model.ps, s.method
        m.gradients.settle(wait=True)                # (the device's timers, counted)
        arrays, scalars = m.codec.state(ps)
        host = (lambda a: to_numpy(a).copy()) if copies else to_numpy
        return cls(host(ps.params), host(s.opt.momentum), host(ps.buffers),
                   {k: host(v) for k, v in arrays.items()}, scalars, copy.deepcopy(run.st),
                   copy.deepcopy(run.straggle.rng.bit_generator.state), run.bad.state(), run.trace.lines)

    @classmethod
    def read(cls, path: Path, rank: int, arrays: bool = True) -> tuple[dict, "RankState"]:
        """(the file's metadata, saved rank ``rank``'s state) of checkpoint ``path``, digests
        checked; ``arrays=False``: the JSON part only (the arrays empty)."""
        meta, got, state = ckpt.read_rank(path, rank, arrays)
        empty = np.empty(0)
        return meta, cls(got.pop("params", empty), got.pop("momentum", empty), got.pop("buffers", empty),
                         got, state.get("method", {}), LoopState.from_dict(state.get("loop", {})),
                         state.get("straggler"), state.get("bad_samples"), state.get("trace_lines"))

    def to_record(self, global_samples: int) -> tuple[dict, str]:
        """(arrays, JSON text) for the checkpoint file (``io/checkpoint.py``'s per-rank group)."""
        arrays = {"params": self.params, "momentum": self.momentum, "buffers": self.buffers, **self.arrays}
        state = {"loop": self.loop.to_dict(global_samples=global_samples), "method": self.method,
                 "trace_lines": self.trace_lines, "straggler": self.straggler,
                 "bad_samples": self.bad_samples}
        return arrays, json.dumps(state)

    def put(self, ps, opt) -> None:
        """The replica, momentum and BN statistics into the run's live arrays (host or device)."""
        xp = get_array_module(ps.params)
        ps.params[...] = xp.asarray(self.params)
        opt.momentum[...] = xp.asarray(self.momentum)
        ps.buffers[...] = xp.asarray(self.buffers)


@dataclass
class Origin:
    """Where this rank's state comes from when the job's ranks change (module doc).  ``own`` is the
    state this rank continues, already in this job's terms: on a reshape its replica is the one
    the method asks for, its loop counters place it at ``global_samples`` in this job's data order
    and its bad-sample count is its share of the saved workers'; on a death it is the survivor's own
    state, its data position moved to the agreed count."""

    kind: str                        # one of KINDS
    own: RankState
    global_samples: int              # the count the job continues from (same: this rank's saved one)
    old_size: int                    # ranks of the job the state was held by
    old_workers: int                 # ... of which workers (node groups: worker groups), who push
    path: Path | None = None         # the checkpoint (resumes)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Origin.kind: one of {KINDS}, got {self.kind!r}")

    @property
    def moved(self) -> bool:
        """Whether the job's ranks changed (reshape or survive): the method's exchange partners,
        counters and server bookkeeping of the old job no longer apply as they were."""
        return self.kind != "same"

    def with_replica(self, params, momentum, buffers) -> "Origin":
        """This origin with ``own``'s replica replaced (host arrays)."""
        return replace(self, own=replace(self.own, params=params, momentum=momentum, buffers=buffers))
