"""The gradient role (``roles.GradientReducer``): what a step's gradients go through before the
update.

``LocalGradients``: nothing (every method but all-reduce: each replica steps on its own
gradients).  ``SummedGradients``: a bucketed all-reduce over a group, started during backward
(each bucket as soon as its gradients are final) and completed after it, so the update sees the
group's mean (``grad_scale`` = 1 / the group's size: gradients leave backward already divided, so
the SUM is the mean).  Over the job for ``allreduce``; over a node for node groups
(``hierarchical``).  Where it sums over the job it is also the step's barrier: one all-reduce
(maximum) of "this rank's loss was not finite" and the stop and checkpoint signals, so every rank
learns at once whether any diverged and, after the same step, of every request.

Timers: ``wait`` is that barrier (until the slowest rank finished backward: a straggler shows
here); ``comm`` is starting and progressing the buckets' sums during backward and completing them
after the barrier (the transfer not hidden behind backward); for NCCL, whose call only enqueues
the sum, the sum's device time between two CUDA events (``settle``).
"""
from __future__ import annotations

import numpy as np

from .base import timed


class LocalGradients:
    """Each replica steps on its own gradients: nothing to sum, nothing to wait for."""

    grad_scale = 1.0
    engine = None

    def attach(self, model) -> None:
        pass

    def after_backward(self, step: int, ps, loss_finite: bool = True) -> bool:
        return not loss_finite

    def progress(self) -> None:
        pass

    def settle(self, wait: bool = False) -> None:
        pass

    def use_host_transport(self) -> None:
        pass

    def close(self) -> None:
        pass


class SummedGradients:
    """The gradients' mean over ``group`` (a transport: the job, or a node's), by the all-reducer
    ``dist`` asks for (``dist.allreduce_transport``, bucket size, overlap; agreed by every rank).
    ``signals``: the job's ``train.control.Signals`` when this sum is the step's barrier (the job's
    sum), else None."""

    def __init__(self, group, dist, timers: dict, signals=None):
        self.group, self.dist, self.timers, self.signals = group, dist, timers, signals
        self.engine = None

    @property
    def grad_scale(self) -> float:
        return 1.0 / self.group.size

    def _timed(self, key: str):
        return timed(self.timers, key, self.group.clock)

    def attach(self, model) -> None:
        """The bucketed all-reducer on the model's flat gradients, hooked into its backward (its
        overlap is what runs: False for NCCL, which the factory says in a warning)."""
        self.engine = self.group.allreducer(model.ps.grads, model.ps.layout, self.dist)
        if self.engine.overlap and self.group.size > 1:
            model.set_grad_hook(self._ready)

    def _ready(self, names) -> None:
        """From backward: starting a bucket's sum (and MPI progress) moves bytes: comm."""
        with self._timed("comm"):
            self.engine.ready(names)

    def progress(self) -> None:
        if self.engine is not None and self.group.size > 1:
            with self._timed("comm"):
                self.engine.progress()

    def after_backward(self, step: int, ps, loss_finite: bool = True) -> bool:
        """Starts what backward left (in the same order on every rank), then, where this sum is the
        job's barrier, the three-number maximum, then completes every bucket (even when stopping:
        no request left open)."""
        if self.group.size == 1:
            return not loss_finite
        with self._timed("comm"):
            self.engine.launch_all()
        if self.signals is None:
            with self._timed("comm"):
                self.engine.finish()
            return not loss_finite
        flags = np.array([0 if loss_finite else 1, *self.signals.raised], np.int64)
        with self._timed("wait"):        # every rank has finished backward: the rest is transfer
            flags = self.group.allreduce_max_host(flags)
        with self._timed("comm"):
            self.engine.finish()
        self.signals.merge_collective(flags[1:])       # (not before the liveness check)
        return bool(flags[0])

    def settle(self, wait: bool = False) -> None:
        """NCCL's sum is only enqueued in ``finish``: its device time (CUDA events) is comm."""
        if self.engine is not None:
            self.timers["comm"] += self.engine.device_seconds(wait)

    def use_host_transport(self) -> None:
        """Sums through the host transport from now on (MPI on pinned host copies): the buckets and
        the overlap stay as they were, so the hook ``attach`` set still fits."""
        old, self.engine = self.engine, self.engine.on_host()
        old.close()                            # e.g. its NCCL communicator

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
