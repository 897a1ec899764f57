"""The interface every method implements, and the behaviour shared by most of them.

A rank is a worker (trains a replica on its part of the data) or, for the parameter-server methods,
the server.  The loop calls on a worker, per step::

    loss = train_step(model, x, y)              # fills ps.grads, no communication
    method.after_backward(step, ps)             # e.g. all-reduce of the gradients
    opt.step(ps.params, ps.grads, lr)
    gs = method.after_update(step, ps, n)       # e.g. elastic / gossip averaging; -> global samples

Progress is counted in **global samples** (all workers together), so epochs, the learning-rate
schedule and stopping mean the same for every method.  Validation happens at fixed global-sample
boundaries; every rank (server included) enters the evaluation collective for boundary b as soon
as it knows the global count has reached b (``Evaluation`` below), so no rank waits for a message
that will never come.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from ..comm import collectives


class MethodError(RuntimeError):
    """The method cannot run on this MPI world (wrong number of ranks, bad setting...)."""


class Method:
    """Synchronous base: every rank is a worker, global samples advance in lockstep."""

    name = "base"
    uses_server = False          # server methods: rank 0 holds the center/master, trains no data
    min_ranks = 1

    def __init__(self, cfg, topo):
        if topo.size < self.min_ranks:
            roles = " (a server and a worker)" if self.uses_server and self.min_ranks == 2 else ""
            raise MethodError(f"method '{self.name}' needs at least {self.min_ranks} ranks{roles}, "
                              f"got {topo.size}")
        self.cfg, self.topo, self.comm = cfg, topo, topo.comm
        self.global_samples = 0
        self.timers = {"comm": 0.0, "wait": 0.0}

    # ------------------------------------------------------------------ roles
    @property
    def is_server(self) -> bool:
        return self.uses_server and self.topo.rank == 0

    @property
    def num_workers(self) -> int:
        return self.topo.size - (1 if self.uses_server else 0)

    @property
    def worker_index(self) -> int:
        """0..num_workers-1 on workers; -1 on the server."""
        return self.topo.rank - (1 if self.uses_server else 0)

    @property
    def grad_scale(self) -> float:
        """Factor on every gradient, applied for free through dL/dlogits (allreduce: 1/p)."""
        return 1.0

    @property
    def lr_batch(self) -> int:
        """The batch one update is computed from (for the linear-scaling rule)."""
        return self.cfg.data.batch_size

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        """Makes every replica identical to rank 0's (params and BN statistics)."""
        if self.topo.size > 1:
            collectives.bcast(self.comm, ps.params, 0)
            collectives.bcast(self.comm, ps.buffers, 0)

    def after_backward(self, step: int, ps) -> None:
        """Gradients in ``ps.grads`` are final on this rank."""

    def after_update(self, step: int, ps, samples: int) -> int:
        """Parameters were updated locally from ``samples`` samples; returns the global count."""
        self.global_samples += samples * self.num_workers
        return self.global_samples

    def serve(self, ps, boundaries, on_boundary) -> None:
        """Server ranks only: serve workers until the last boundary has been evaluated."""
        raise MethodError(f"method '{self.name}' has no server")

    def stats(self) -> dict:
        """Method-specific values for the per-step metrics (staleness, exchanges...)."""
        return {}

    def close(self) -> None:
        """Frees windows and other MPI objects; called once after training on every rank."""

    # ------------------------------------------------------------------ evaluation
    def load_eval_model(self, ps) -> dict:
        """Collective: puts the model to evaluate into ``ps`` (own replica by default); may return
        extra metrics (e.g. the consensus distance)."""
        return {}

    @contextlib.contextmanager
    def evaluation(self, ps):
        """Collective over all ranks: swaps in the model to evaluate, restores this rank's own.

        Everything ``load_eval_model`` writes into ``ps`` is undone afterwards, so it must not
        change method state that lives in ``ps`` (e.g. fold a gossip inbox into the parameters)."""
        saved_p, saved_b = ps.params.copy(), ps.buffers.copy()
        try:
            yield self.load_eval_model(ps)
        finally:
            ps.params[...] = saved_p
            ps.buffers[...] = saved_b

    def reduce_counts(self, counts) -> np.ndarray:
        """Sums (top1, top5, n) over all ranks (the server contributes zeros)."""
        return collectives.allreduce_sum_host(self.comm, np.asarray(counts, dtype=np.float64))

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def timed(self, key: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timers[key] += time.perf_counter() - t


def eval_boundaries(total: int, period: int) -> list[int]:
    """Global-sample counts at which every rank evaluates: period, 2*period, ..., total."""
    period = max(1, min(period, total))
    out = list(range(period, total, period))
    return out + [total]
