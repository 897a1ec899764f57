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
import logging
import time

import numpy as np

from ..comm import collectives, watchdog
from ..errors import MethodError, PhaseError  # noqa: F401 - re-exported


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
        # Signals travel with the exchanges, max-merged: [stop, checkpoint generation].  ``raised`` is
        # what this rank asks for (SIGTERM/SIGUSR1 -> stop; rank 0's clock -> a checkpoint), ``seen``
        # the maximum it knows of.  A rank enters a phase once it has seen a new signal.
        self.raised = np.zeros(2, dtype=np.int64)
        self.seen = np.zeros(2, dtype=np.int64)
        self.phase_done = -1             # index of the last boundary all ranks processed (loop)
        self.ckpt_done = 0               # last checkpoint generation all ranks wrote (loop)

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
        """Parameters were updated locally from ``samples`` samples; returns the global count.

        Synchronous methods advance in lockstep; a stop request anywhere is known everywhere after
        the same step (one tiny all-reduce per step)."""
        self.global_samples += samples * self.num_workers
        self.seen = self.max_over_ranks(self.raised)
        return self.global_samples

    def request_stop(self) -> None:
        self.raised[0] = 1

    def request_checkpoint(self) -> None:
        self.raised[1] = max(self.raised[1], self.seen[1]) + 1

    @property
    def stop_seen(self) -> bool:
        return bool(self.seen[0])

    def signal_pending(self) -> bool:
        """A stop or a checkpoint this rank has heard of and that no phase has handled yet."""
        return bool(self.seen[0]) or int(self.seen[1]) > self.ckpt_done

    def max_over_ranks(self, v: np.ndarray) -> np.ndarray:
        """Collective: element-wise maximum of a small int64 vector over all ranks."""
        if self.topo.size == 1:
            return v.copy()
        return collectives.allreduce_max_host(self.comm, np.asarray(v, dtype=np.int64))

    poll_in_phase = None
    """None, or a callable run while this rank waits in a phase agreement; it raises when the
    agreement can never complete (the server methods: a push arrives, so a worker is not there)."""

    def agree(self, want: int) -> tuple[int, bool, int]:
        """Collective over all ranks at a phase (see train/loop.py): the furthest boundary index any
        rank reached, whether any rank knows of a stop, the newest checkpoint generation asked for."""
        v = np.array([want, self.seen[0], self.seen[1]], dtype=np.int64)
        if self.topo.size > 1:          # non-blocking on every rank, so that a server can poll
            v = collectives.iallreduce_max_host(self.comm, v, self.poll_in_phase)
        self.seen[:] = np.maximum(self.seen, v[1:])
        return int(v[0]), bool(v[1]), int(v[2])

    # ------------------------------------------------------------------ checkpoints
    def quiesce(self, ps) -> None:
        """Collective, inside a phase (no exchange in flight): fold any pending incoming state into
        this rank's own (gossip push drains its inbox) so that ``ps`` is complete for a checkpoint."""

    def funnel(self, arrays: dict, text: str, sink) -> None:
        """Collective: every rank's host arrays and text reach ``sink(rank, arrays, text)`` on
        rank 0, one rank at a time (checkpoint writing)."""
        collectives.funnel(self.comm, arrays, text, sink)

    def state(self, ps) -> tuple[dict, dict]:
        """(arrays, JSON scalars) of method state beyond ps/momentum, for a checkpoint."""
        return {}, {"global_samples": self.global_samples, "timers": dict(self.timers)}

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        """Restores what ``state`` returned (after ``start``: windows and ports exist)."""
        self.global_samples = int(scalars["global_samples"])
        self.timers.update(scalars["timers"])

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


class Stopped(Exception):
    """Every rank agreed to stop (a SIGTERM/SIGUSR1 somewhere); the checkpoint has been written."""


class Phases:
    """Turns global progress and signals into collective *phases*, the same sequence on every rank.

    ``boundaries`` are increasing global-sample counts (the last = the end of training).  A rank
    enters a phase as soon as it knows the count reached a boundary beyond ``method.phase_done`` or
    it has heard of a new signal (stop, checkpoint).  In the phase all ranks agree (``agree``: the
    furthest boundary any reached, stop, checkpoint generation), then each runs
    ``on_boundary(i)`` for every boundary up to the agreed one (evaluation), and last, once
    ``phase_done`` is the agreed boundary, ``on_checkpoint(reason)`` if a checkpoint is due at one
    of them, was asked for, or a stop was; then it raises ``Stopped`` on a stop.  Because every
    trigger is a monotone global condition that each rank learns at its next exchange (and a server
    only enters once every worker was told), all ranks enter the same phases in the same order.

    Invariant (what makes a checkpoint resumable): after a phase, no rank's global count has reached
    a boundary beyond ``phase_done`` (the agreed index is the maximum over the ranks), and a
    checkpoint is written only after the phase, so it records exactly that ``phase_done``.  A
    resumed run therefore enters no phase before its first exchange, like the run it continues;
    ``reconcile`` checks this (and repairs checkpoints of older versions, which recorded the
    boundary before the one being processed).
    """

    def __init__(self, method, boundaries, on_boundary, on_checkpoint=None):
        self.m, self.boundaries = method, list(boundaries)
        self.on_boundary, self.on_checkpoint = on_boundary, on_checkpoint

    def reached(self, gs: int) -> int:
        """Index of the furthest boundary <= gs (-1 if none)."""
        return int(np.searchsorted(self.boundaries, gs, side="right")) - 1

    @property
    def finished(self) -> bool:
        return self.m.phase_done >= len(self.boundaries) - 1

    def check(self, gs: int) -> bool:
        """Worker, after each step: runs a phase if one is due; True when training is over."""
        want = self.reached(gs)
        if want > self.m.phase_done or self.m.signal_pending():
            return self.run(want)
        return False

    def run(self, want: int) -> bool:
        """Collective: one phase.  Returns True when the last boundary has been processed."""
        m = self.m
        watchdog.doing(f"in the phase agreement after boundary {m.phase_done} (this rank wants "
                       f"{want}{', a stop' if m.stop_seen else ''})")
        idx, stop, gen = m.agree(want)
        due = False                        # a checkpoint is scheduled at one of the boundaries
        while m.phase_done < idx:
            due |= bool(self.on_boundary(m.phase_done + 1))
            m.phase_done += 1
        asked = gen > m.ckpt_done
        m.ckpt_done = max(m.ckpt_done, gen)
        if (due or asked or stop) and self.on_checkpoint is not None:
            self.on_checkpoint("end" if self.finished else "stop" if stop else
                               "scheduled" if due else "clock")
        if stop and not self.finished:
            watchdog.stop_checkpointed()
            raise Stopped()
        return self.finished

    def reconcile(self, source) -> None:
        """Collective, right after a resumed run restored its state: every rank continues after the
        same boundary, and no rank is past a boundary that is not recorded as processed.

        Checkpoints written before this invariant existed recorded the boundary *before* the one
        being processed; for them the furthest boundary any rank's count reached is the one the
        phase really processed (see the class docstring), so ``phase_done`` becomes that."""
        m = self.m
        ahead = self.reached(m.global_samples)
        v = m.max_over_ranks(np.array([ahead, m.phase_done, -m.phase_done], dtype=np.int64))
        if v[1] != -v[2]:
            raise MethodError(f"{source}: the ranks restored different phases "
                              f"(boundaries {-int(v[2])}..{int(v[1])}): corrupt checkpoint")
        if v[0] > m.phase_done:
            logging.getLogger("scalesgd").info(
                "%s records boundary %d as the last processed but the ranks are past boundary %d "
                "(a checkpoint of an older version): continuing after %d", source, m.phase_done,
                int(v[0]), int(v[0]))
            m.phase_done = int(v[0])


def eval_boundaries(total: int, period: int) -> list[int]:
    """Global-sample counts at which every rank evaluates: period, 2*period, ..., total."""
    period = max(1, min(period, total))
    out = list(range(period, total, period))
    return out + [total]
