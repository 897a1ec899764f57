"""``allreduce``: synchronous SGD.  Every step the flat gradient buffer is averaged over all ranks
with MPI all-reduce (bucketed, started during backward), so every rank applies the same update and
the replicas stay identical (initial weights broadcast from rank 0 in ``start``).

BN running statistics stay per replica during training (each rank normalises its own minibatch, as
in PyTorch DDP); they are averaged over ranks when the model is evaluated.

Timers: ``wait`` is one barrier after backward (a three-number all-reduce: whether any rank's loss
was not finite, and the stop and checkpoint signals; the step's only small collective), i.e. the
time until the slowest rank has finished its backward pass (a straggler shows here); ``comm`` is
starting and progressing the buckets'
all-reduces during backward, and completing them after the barrier (the transfer not hidden
behind backward); for NCCL, whose call only enqueues the sum, the sum's device time between two
CUDA events (``settle``).  The barrier costs one small-message latency per step.
"""
from __future__ import annotations

import numpy as np

from .base import Method, Traits


class AllReduce(Method):
    name = "allreduce"
    # the gradients' sum is checked (a dead rank) before the update uses it
    traits = Traits(replicas_identical=True, check_after="backward")

    def __init__(self, cfg, roles, comm, signals):
        super().__init__(cfg, roles, comm, signals)
        self.reducer = None

    @property
    def grad_scale(self) -> float:
        """Gradients leave backward already divided by p, so the all-reduce SUM is the mean."""
        return 1.0 / self.roles.size

    def attach(self, model) -> None:
        """Hooks the bucketed all-reduce into the model's backward (called by the loop)."""
        # one transport for the run, by name (dist.allreduce_transport), agreed by every rank;
        # reducer.overlap is what runs (False for nccl, which the factory says in a warning)
        self.reducer = self.comm.allreducer(model.ps.grads, model.ps.layout, self.cfg.dist)
        if self.reducer.overlap and self.roles.size > 1:
            model.set_grad_hook(self._ready)

    def use_host_transport(self) -> None:
        """Sums the gradients through the host transport from now on (MPI on pinned host copies):
        the fallback when the start-up check (fastpaths/) fails the device transport.  The
        buckets and the overlap stay as they were, so the grad hook set by ``attach`` still fits."""
        old, self.reducer = self.reducer, self.reducer.on_host()
        old.close()                              # e.g. its NCCL communicator

    def _ready(self, names) -> None:
        """From backward: starting a bucket's all-reduce (and MPI progress) moves bytes: comm."""
        with self.timed("comm"):
            self.reducer.ready(names)

    def progress(self) -> None:
        if self.reducer is not None and self.roles.size > 1:
            with self.timed("comm"):
                self.reducer.progress()

    def after_backward(self, step: int, ps, loss_finite: bool = True) -> bool:
        """The barrier is one all-reduce (maximum) of "this rank's loss was not finite" and this
        rank's signals, so every rank learns at once whether any diverged (identical replicas: all
        stop, one message) and, after the same step, of every stop or checkpoint request."""
        if self.roles.size == 1:
            return not loss_finite
        with self.timed("comm"):
            self.reducer.launch_all()      # (before the next collective: the same order everywhere)
        flags = np.array([0 if loss_finite else 1, *self.signals.raised], np.int64)
        with self.timed("wait"):           # every rank has finished backward: the rest is transfer
            flags = self.comm.allreduce_max_host(flags)
        with self.timed("comm"):
            self.reducer.finish()          # (completed even when stopping: no request left open)
        self.seen_now = flags[1:]
        return bool(flags[0])

    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        """The signals came with the barrier after backward: no collective here."""
        self.global_samples += samples * self.roles.num_workers
        self.signals.merge(self.seen_now if self.roles.size > 1 else self.signals.raised)
        return self.global_samples

    def settle(self, wait: bool = False) -> None:
        """NCCL's sum is only enqueued in ``finish``: its device time (CUDA events) is comm."""
        if self.reducer is not None:
            self.timers["comm"] += self.reducer.device_seconds(wait)

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()

    def load_eval_model(self, ps) -> dict:
        """The replicas are identical; average the per-replica BN statistics."""
        self.comm.allreduce_mean(ps.buffers)
        return {}
