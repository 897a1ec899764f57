"""When a gossip exchange's communication runs: the *exchangers* of ``methods/gossip.py``.

An exchange is the strategy's ``begin`` (the communication: pull reads the peer, push sends half)
then its ``finish`` (the effect: pull mixes and publishes, push drains and folds), plus the global
counter update.  ``Blocking`` (the authors' gossip) runs all of it at once on the training thread.
``Overlapped`` (``dist.gossip_overlap``) hands the communication and the counter update to a courier
thread (``comm.mpi.window.Courier``) and collects them at the next exchange, so they run under the next
step's compute; its ``quiesce`` collects, flushes every window and waits for every rank before a
checkpoint reads anything.  The exchange protocol itself is gossip.py's module doc.
"""
from __future__ import annotations

import abc
from typing import Protocol

from ..comm.jobs import POLL_SECONDS


class Exchanges(Protocol):
    """What an exchanger uses of its gossip method (``gossip.Gossip`` is the one implementation)."""

    comm: object          # the transport (``barrier``)
    signals: object       # this rank's signals (``raised``: int64 flags for the counter update)
    counter: object       # the global sample counter (``add``)
    windows: list         # every window this rank opened (``waited``, ``flush_all``)
    exchanges: int        # exchanges done by this rank

    def begin(self, x, peer: int | None, poll: float | None): ...
    def land(self, got, x: int, peer: int | None) -> None: ...
    def finish(self, x) -> None: ...
    def counted(self, total: int, sig, samples: int, x: int) -> None: ...


class Exchanger(abc.ABC):
    """When a gossip exchange's communication runs (``begin``'s job), relative to its effect
    (``finish``) and the counter update; what the exchange leaves in flight, in checkpoints."""

    def __init__(self, g: Exchanges):
        self.g = g

    @abc.abstractmethod
    def exchange(self, x, peer: int | None, samples: int) -> None:
        """One exchange on host vector ``x`` (in place) with ``peer`` (None: this rank drew itself),
        reporting ``samples`` to the global counter."""

    def waited(self) -> float:
        """Seconds this thread's window calls were blocked on other ranks so far."""
        return 0.0

    def quiesce(self) -> None:
        """Collective, inside a phase: every update this rank started has landed at its target."""

    def stats(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"pending": -1}

    def load_state(self, scalars: dict) -> None:
        """After the restore (every rank has published its restored parameters)."""

    def close(self) -> None:
        pass


class Blocking(Exchanger):
    """The communication runs at once, on this thread (the authors' gossip): begin, land, finish,
    then the counter update, in that order."""

    def exchange(self, x, peer, samples) -> None:
        g = self.g
        job = g.begin(x, peer, None)
        if job is not None:
            g.land(job(), g.exchanges, peer)
        g.finish(x)
        total, sig = g.counter.add(samples, g.signals.raised)
        g.counted(total, sig, samples, g.exchanges)

    def waited(self) -> float:
        """The counter updates and the pull reads' failed tries (the peer was publishing)."""
        return sum(w.waited for w in self.g.windows)


class Overlapped(Exchanger):
    """The communication runs on a courier thread, under the next step: exchange e collects what
    e-1 started (its counter update: the global count, one exchange old; pull: the peer's copy,
    one exchange older), finishes it, then starts e's job and counter update on the courier."""

    def __init__(self, g: Exchanges, courier):
        super().__init__(g)
        self.courier = courier
        self.in_flight_peer = None        # the peer of the exchange in flight (None: none)

    def exchange(self, x, peer, samples) -> None:
        self.collect()
        self.g.finish(x)
        self.start(self.g.begin(x, peer, POLL_SECONDS), samples)
        self.in_flight_peer = peer

    def start(self, job, samples: int) -> None:
        """The courier runs ``job`` (None: nothing to move), then adds ``samples`` to the global
        counter with this rank's signals."""
        self.courier.submit(self._background, job, samples, self.g.signals.raised.copy())

    def _background(self, job, samples: int, raised) -> tuple:
        got = None if job is None else job()
        return got, self.g.counter.add(samples, raised, POLL_SECONDS), samples

    def collect(self) -> None:
        """Completes the exchange in flight, if any: its counter update is applied now (a count
        never ahead of the counter's, so phases stay safe), its result handed to the strategy."""
        if self.courier.idle_error is not None:     # its idle progress failed (a dead rank)
            raise self.courier.idle_error
        if not self.courier.busy:
            return
        got, (total, sig), samples = self.courier.wait()
        g = self.g
        g.counted(total, sig, samples, g.exchanges - 1)
        if got is not None:
            g.land(got, g.exchanges - 1, self.in_flight_peer)
        self.in_flight_peer = None         # nothing of this rank's is in flight any more

    def quiesce(self) -> None:
        """The exchange in flight is collected and every window flushed (a push or counter update
        the courier returned from may still be on its way), then a barrier."""
        self.collect()
        for w in self.g.windows:
            w.win.flush_all()
        self.g.comm.barrier()

    def stats(self) -> dict:
        return {"gossip_background_seconds": self.courier.busy_seconds,
                "gossip_exposed_seconds": self.courier.exposed_seconds}

    def state(self) -> dict:
        """The courier's seconds (cumulative, as the timers) and the peer of an exchange in flight
        (none after ``quiesce``; a checkpoint written without it would have its read started
        again on resume)."""
        return {"pending": -1 if self.in_flight_peer is None else self.in_flight_peer,
                "courier_seconds": [self.courier.busy_seconds, self.courier.exposed_seconds]}

    def load_state(self, scalars: dict) -> None:
        if "courier_seconds" in scalars:
            self.courier.busy_seconds, self.courier.exposed_seconds = scalars["courier_seconds"]
        peer = int(scalars.get("pending", -1))       # (older checkpoints: nothing in flight)
        if peer >= 0:
            self.in_flight_peer = peer
            self.start(self.g.begin(None, peer, POLL_SECONDS), 0)

    def close(self) -> None:
        self.courier.close()
