"""Phases: global progress and signals turned into collectives, the same sequence on every rank.

``boundaries`` are increasing global-sample counts (the last = the end of training).  A rank enters
a phase as soon as it knows the count reached a boundary beyond ``control.phase_done`` or it has
seen a signal no phase has handled (stop, checkpoint).  In the phase all ranks agree
(``Control.agree``: the furthest boundary any reached, stop, checkpoint generation), then each runs
``on_boundary(i)`` for every boundary up to the agreed one (evaluation), and last, once
``phase_done`` is the agreed boundary, ``on_checkpoint(reason)`` if a checkpoint is due at one of
them, was asked for, or a stop was; then it raises ``Stopped`` on a stop.  Because every trigger is
a monotone global condition that each rank learns at its next exchange (and a server only enters
once every worker was told), all ranks enter the same phases in the same order.

Invariant (what makes a checkpoint resumable): after a phase, no rank's global count has reached a
boundary beyond ``phase_done`` (the agreed index is the maximum over the ranks), and a checkpoint is
written only after the phase, so it records exactly that ``phase_done``.  A resumed run therefore
enters no phase before its first exchange, like the run it continues; ``reconcile`` checks this
(and repairs checkpoints of older versions, which recorded the boundary before the one being
processed).
"""
from __future__ import annotations

import logging

import numpy as np

from ..comm import watchdog
from ..errors import MethodError


class Stopped(Exception):
    """Every rank agreed to stop (a SIGTERM/SIGUSR1 somewhere); the checkpoint has been written."""


def eval_boundaries(total: int, period: int) -> list[int]:
    """Global-sample counts at which every rank evaluates: period, 2*period, ..., total."""
    period = max(1, min(period, total))
    out = list(range(period, total, period))
    return out + [total]


class Phases:
    """Drives ``control`` (a ``train.control.Control``) through the phases of ``boundaries``.

    ``poll``: None, or a callable run while this rank waits in a phase agreement; it raises when the
    agreement can never complete (a server: a push arrives, so a worker is not there).
    ``tick``: None, or a callable run at every ``due`` (rank 0's checkpoint clock)."""

    def __init__(self, control, boundaries, on_boundary, on_checkpoint=None, poll=None, tick=None):
        self.c, self.boundaries = control, list(boundaries)
        self.on_boundary, self.on_checkpoint, self.poll = on_boundary, on_checkpoint, poll
        self.tick = tick

    def reached(self, gs: int) -> int:
        """Index of the furthest boundary <= gs (-1 if none)."""
        return int(np.searchsorted(self.boundaries, gs, side="right")) - 1

    @property
    def finished(self) -> bool:
        return self.c.phase_done >= len(self.boundaries) - 1

    def due(self, gs: int, sig) -> bool:
        """Whether count ``gs`` and signals ``sig`` call for a phase (after the clock's tick)."""
        if self.tick is not None:
            self.tick()
        return self.reached(gs) > self.c.phase_done or self.c.unhandled(sig)

    def enter(self, gs: int) -> bool:
        """Collective: the phase for count ``gs``; True when training is over."""
        return self.run(self.reached(gs))

    def check(self, gs: int, sig) -> bool:
        """After each step (a worker: its count and ``signals.seen``) or each push served (a
        server: the count and signals every worker has been told of): runs a phase if one is
        due; True when training is over."""
        return self.enter(gs) if self.due(gs, sig) else False

    def run(self, want: int) -> bool:
        """Collective: one phase.  Returns True when the last boundary has been processed."""
        c = self.c
        watchdog.doing(f"in the phase agreement after boundary {c.phase_done} (this rank wants "
                       f"{want}{', a stop' if c.signals.stop_seen else ''})")
        idx, stop, gen = c.agree(want, self.poll)
        due = False                        # a checkpoint is scheduled at one of the boundaries
        while c.phase_done < min(idx, len(self.boundaries) - 1):   # (on_boundary may end_at)
            due |= bool(self.on_boundary(c.phase_done + 1))
            c.phase_done += 1
        asked = gen > c.ckpt_done
        c.ckpt_done = max(c.ckpt_done, gen)
        if (due or asked or stop) and self.on_checkpoint is not None:
            self.on_checkpoint("end" if self.finished else "stop" if stop else
                               "scheduled" if due else "clock")
        if stop and not self.finished:
            watchdog.stop_checkpointed()
            raise Stopped()
        return self.finished

    def end_at(self, i: int) -> None:
        """Makes boundary ``i`` the last (``train.stop_at_error`` reached there): every rank calls
        it in the same phase, from the same collective evaluation, so all end together."""
        self.boundaries = self.boundaries[:i + 1]

    def reconcile(self, source, global_samples: int, reshaped: bool = False) -> None:
        """Collective, right after a resumed run restored its state: every rank continues after the
        same boundary, and no rank is past a boundary that is not recorded as processed.

        Checkpoints written before this invariant existed recorded the boundary *before* the one
        being processed; for them the furthest boundary any rank's count reached is the one the
        phase really processed (see the module docstring), so ``phase_done`` becomes that.
        ``reshaped``: resumed on another rank count, whose epochs (whole global batches) differ, so
        the saved boundary can fall between this job's boundaries: the ones up to the count are
        taken as done, so an evaluation can be skipped, or come a few samples after the saved one
        at the "same" epoch (the history then shows both, with their ``workers``)."""
        c = self.c
        ahead = self.reached(global_samples)
        v = c.max_over_ranks([ahead, c.phase_done, -c.phase_done])
        if v[1] != -v[2]:
            raise MethodError(f"{source}: the ranks restored different phases "
                              f"(boundaries {-int(v[2])}..{int(v[1])}): corrupt checkpoint")
        if v[0] > c.phase_done:
            logging.getLogger("scalesgd").info(
                "%s: continuing after boundary %d, the last one the global count has passed in this "
                "job's epochs", source, int(v[0])) if reshaped else logging.getLogger("scalesgd").info(
                "%s records boundary %d as the last processed but the ranks are past boundary %d "
                "(a checkpoint of an older version): continuing after %d", source, c.phase_done,
                int(v[0]), int(v[0]))
            c.phase_done = int(v[0])
