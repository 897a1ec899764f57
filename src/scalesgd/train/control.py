"""The control plane of a run: the stop/checkpoint signals and the phase counters, and the few
collectives that act on them.  Methods (``methods/``) only move parameters; they are handed the
``Signals`` to piggyback on their messages and never see the rest.

Signals are two max-merged int64s, ``[stop, checkpoint generation]``.  ``raised`` is what this rank
asks for (SIGTERM/SIGUSR1 -> stop; rank 0's clock -> a new checkpoint generation), ``seen`` the
maximum this rank knows of.  A method sends ``raised`` (a server: ``seen``) with its messages and
``merge``s what it receives into ``seen``; a rank enters a phase (``train/phases.py``) once it has
seen a signal no phase has handled yet.
"""
from __future__ import annotations

import numpy as np

from ..io.trace import Recorder



class Signals:
    """What the control plane tells a method: ``raised`` and ``seen``, int64[2] each, ``[stop,
    checkpoint generation]``, carried on its messages; and ``check_alive``, which raises once a
    rank of the job died (``train.on_failure = continue``: set by the loop, else None)."""

    STOP, CKPT = 0, 1

    def __init__(self):
        self.raised = np.zeros(2, dtype=np.int64)
        self.seen = np.zeros(2, dtype=np.int64)
        self.check_alive = None

    def request_stop(self) -> None:
        """May run on the watchdog's signal thread: one store."""
        self.raised[self.STOP] = 1

    def request_checkpoint(self) -> None:
        self.raised[self.CKPT] = max(self.raised[self.CKPT], self.seen[self.CKPT]) + 1

    def merge(self, v) -> None:
        """``seen`` <- max(``seen``, v) element-wise (v: anything of two ints)."""
        np.maximum(self.seen, np.asarray(v, dtype=np.int64), out=self.seen)

    def merge_collective(self, v) -> None:
        """``merge`` what a collective over the job returned, once ``check_alive`` (where set) found
        no rank dead: a collective a rank died in may complete with garbage (Open MPI over TCP: a
        false stop request), which must not reach ``seen``, since a survivor carries it on."""
        if self.check_alive is not None:
            self.check_alive()
        self.merge(v)

    @property
    def stop_seen(self) -> bool:
        return bool(self.seen[self.STOP])


class Control:
    """The communicator of the run, its ``Signals`` and the phase counters, owned in one place.

    ``phase_done``: index of the last boundary every rank processed; ``ckpt_done``: the last
    checkpoint generation every rank wrote.  Only ``Phases`` (and a restore) change them."""

    def __init__(self, comm, size: int):
        self.comm, self.size = comm, size
        self.signals = Signals()
        self.trace = Recorder()          # the run's events (the loop opens it in the run's directory)
        self.phase_done = -1
        self.ckpt_done = 0

    def unhandled(self, sig) -> bool:
        """Whether signals ``sig`` (int64[2]) hold a stop or a checkpoint no phase handled yet."""
        return bool(sig[Signals.STOP]) or int(sig[Signals.CKPT]) > self.ckpt_done

    def max_over_ranks(self, v) -> np.ndarray:
        """Collective: element-wise maximum of a small int64 vector over all ranks."""
        v = np.asarray(v, dtype=np.int64)
        return v.copy() if self.size == 1 else self.comm.allreduce_max_host(v)

    def sum_over_ranks(self, v) -> np.ndarray:
        """Collective: element-wise sum of a small float64 vector over all ranks (rank 0, which
        records the run's history, is a server for the server methods: it contributes zeros)."""
        v = np.asarray(v, dtype=np.float64)
        return v.copy() if self.size == 1 else self.comm.allreduce_sum_host(v)

    def agree(self, want: int, poll=None) -> tuple[int, bool, int]:
        """Collective at a phase: the furthest boundary index any rank reached, whether any rank
        knows of a stop, the newest checkpoint generation asked for.  Non-blocking on every rank,
        so that ``poll`` (a server's check for pushes that should not come) runs while waiting."""
        seen = self.signals.seen
        v = np.array([want, seen[0], seen[1]], dtype=np.int64)
        if self.size > 1:
            v = self.comm.iallreduce_max_host(v, poll)
            self.signals.merge_collective(v[1:])        # (a rank died inside it: garbage)
        else:
            self.signals.merge(v[1:])
        return int(v[0]), bool(v[1]), int(v[2])

    def funnel(self, arrays: dict, text: str, sink) -> None:
        """Collective: every rank's host arrays and text reach ``sink(rank, arrays, text)`` on
        rank 0, one rank at a time (checkpoint writing)."""
        self.comm.funnel(arrays, text, sink)

    def restored(self, phase_done: int, ckpt_done: int) -> None:
        """A checkpoint's counters; the clock's next request is a new generation."""
        self.phase_done, self.ckpt_done = phase_done, ckpt_done
        self.signals.raised[Signals.CKPT] = self.signals.seen[Signals.CKPT] = ckpt_done
