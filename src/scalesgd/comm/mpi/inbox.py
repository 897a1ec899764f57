"""Push-sum's inbox: a window per rank that the others add messages into and its owner drains,
whole messages at a time and in an order the drain knows.

``MPI_Accumulate`` is atomic per basic element, not per call (MPI-3.1, section 11.7), and a drain
is one ``Get_accumulate``: without more, a drain that overlaps an arriving message may take part
of it (its numerator before its weight) and leave the rest for the next drain, and the order in
which the messages of one drain were added is MPI's alone.  Both are harmless to the mass (nothing
is lost or counted twice) but they make a run impossible to redo: a replay cannot know which part
of which message a drain took, nor add three or more messages in the order the run did.

So every access to the sum takes a *turn* at its owner's inbox, a ticket lock made of MPI atomics
inside the window's one ``Lock_all(MODE_NOCHECK)`` epoch (no ``MPI_Win_lock``: a checked lock
cannot be taken inside that epoch, a second window with checked locks hung MPICH 5.0.2 when mixed
with it, and across nodes it waits for a busy target to enter MPI).  Layout of a rank's window,
in bytes::

    [0, 8)    next     int64  the next ticket to hand out
    [8, 16)   serving  int64  the ticket whose turn it is
    [16, 64)  padding
    [64, 64 + 8 L)   log: the rank that held ticket t, at t mod L (L = ``LOG_SLOTS``)
    [64 + 8 L, ...)  the sum: n items of the dtype

A sender takes a ticket (``Get_accumulate`` SUM of (1, 0) on (next, serving): its ticket and, at
once, whose turn it is), waits for ``serving`` to reach it (``Fetch_and_op`` NO_OP, every 0.1 ms;
from a courier too: a turn that came while its holder slept would stall everyone queued behind),
writes its rank into the log, adds its message (``Accumulate`` SUM), ``Flush``es (the message is
complete at the target) and only then passes the turn on (``Accumulate`` SUM of 1 on serving,
flushed).  The owner's drain takes a turn the same way, moves
the sum out and leaves zeros (``Get_accumulate`` REPLACE), reads the log entries of the tickets
since its previous drain, and passes the turn on.  So a drain folds exactly the messages whose
tickets precede its own, each whole, and knows their senders in the order they were added:
((0 + m_1) + m_2) + ..., which a replay repeats bit for bit (float addition is commutative, so
which operand MPI's ``SUM`` puts first does not matter).  A drain with no ticket handed out since
the previous one (one atomic read) returns zeros without a turn.  Concurrent accumulates to one
address use one operation or NO_OP (the window's default ``accumulate_ops = same_op_no_op``):
SUM and NO_OP on the ticket words, REPLACE on a log slot and SUM / REPLACE on the sum only within
a turn.

Cost (docs/methods.md): a push makes two more round trips of 8-16 bytes than a bare
``Accumulate`` (the ticket, the turn passed on) and waits while another sender's message or the
owner's drain holds the turn; on one node MPI does the atomics in shared memory.  The time spent
waiting for a turn is counted in ``waited``.  A rank that died holding a turn would stall the
others: the wait calls ``check_alive`` (a survivor's failure detector) every 0.1 s, and
``drain(locked=False)`` (abandoning a run) takes the sum without a turn.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .window import HEADER_BYTES, Window, settle

LOG_SLOTS = 1024            # a drain names the senders of up to this many messages (more: unknown)
TURN_POLL_SECONDS = 0.0001  # a blocking caller's sleep between two looks at whose turn it is
ALIVE_EVERY_SECONDS = 0.1   # while waiting for a turn: check_alive this often
NEXT, SERVING = 0, 8        # byte displacements of the ticket words


class Inbox:
    """``n`` items of ``dtype`` per rank: others ``push`` whole messages into it, its owner ``drain``s
    them; collective to create (see the module doc for the protocol)."""

    def __init__(self, comm, n: int, dtype):
        self.n, self.dtype = int(n), np.dtype(dtype)
        self.rank = comm.Get_rank()
        self.log_at = HEADER_BYTES
        self.data_at = HEADER_BYTES + 8 * LOG_SLOTS
        self.win = Window(comm, self.data_at + self.n * self.dtype.itemsize)
        self._zeros = np.zeros(self.n, self.dtype)
        self._take, self._got = np.array([1, 0], np.int64), np.zeros(2, np.int64)
        self._one, self._nop, self._r = np.ones(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._me = np.array([self.rank], np.int64)
        self._log = np.empty(LOG_SLOTS, np.int64)
        self.drained_to = 0        # tickets of this rank's inbox below it are drained (or were drains)
        self.waited = 0.0          # seconds spent waiting for a turn
        self.check_alive = None    # on_failure = continue: raises if a rank died (set by the method)

    def memory(self) -> np.ndarray:
        """This rank's sum, in its own window memory (aliases it)."""
        return self.win.view(self.data_at, self.n, self.dtype)

    def _turn(self, target: int, poll: float | None) -> int:
        """Takes a ticket at ``target``'s inbox and returns it once it is that ticket's turn."""
        w = self.win
        w.get_accumulate(self._take, self._got, target, NEXT, MPI.SUM, poll)
        ticket, serving = int(self._got[0]), int(self._got[1])
        if serving == ticket:
            return ticket
        t0 = last = time.perf_counter()
        while serving != ticket:           # (finely even from a courier: a turn that came
            time.sleep(TURN_POLL_SECONDS)  # while its holder slept would stall the queue)
            w.fetch_and_op(self._nop, self._r, target, SERVING, MPI.NO_OP, poll)
            serving = int(self._r[0])
            now = time.perf_counter()
            if self.check_alive is not None and now - last > ALIVE_EVERY_SECONDS:
                self.check_alive()
                last = now
        self.waited += time.perf_counter() - t0
        return ticket

    def _pass_turn(self, target: int) -> None:
        self.win.accumulate(self._one, target, SERVING, MPI.SUM)          # (flushed)

    def push(self, target: int, msg: np.ndarray, poll: float | None = None) -> None:
        """Adds ``msg`` (n items) into ``target``'s inbox, whole; it is there when this returns.
        ``poll`` (a courier): the ticket and the data are request-based calls, polled; the two
        ``Flush``es (the message's completion at the target, the turn passed on) block for a
        round trip."""
        ticket = self._turn(target, poll)
        w, slot = self.win.win, self.log_at + 8 * (ticket % LOG_SLOTS)
        if poll is None:
            w.Accumulate(self._me, target, target=slot, op=MPI.REPLACE)
            w.Accumulate(msg, target, target=self.data_at, op=MPI.SUM)
        else:
            settle(w.Raccumulate(self._me, target, target=slot, op=MPI.REPLACE), poll)
            settle(w.Raccumulate(msg, target, target=self.data_at, op=MPI.SUM), poll)
        w.Flush(target)            # the message is whole at the target before the turn passes on
        self._pass_turn(target)

    def flush(self) -> None:
        """Every push this rank started has been added at its target when this returns (a push
        returns complete already: kept for the callers that flush windows before a checkpoint)."""
        self.win.flush_all()

    def drain(self, out: np.ndarray, locked: bool = True) -> list[int] | None:
        """Moves the messages added so far into ``out`` (their sum) and leaves zeros behind.
        Returns the senders of those messages in the order they were added, or None where that is
        not known (more than ``LOG_SLOTS`` messages; ``locked=False``: without a turn, after a
        rank died, when a dead sender may hold one)."""
        me, w = self.rank, self.win
        if not locked:
            w.get_accumulate(self._zeros, out, me, self.data_at, MPI.REPLACE)
            return None
        w.fetch_and_op(self._nop, self._r, me, NEXT, MPI.NO_OP)
        if int(self._r[0]) == self.drained_to:          # no ticket since the last drain: empty
            out[...] = 0
            return []
        ticket = self._turn(me, None)
        w.get_accumulate(self._zeros, out, me, self.data_at, MPI.REPLACE)
        count, senders = ticket - self.drained_to, None
        if count <= LOG_SLOTS:
            w.get(self._log, me, self.log_at)
            senders = [int(self._log[(self.drained_to + i) % LOG_SLOTS]) for i in range(count)]
        self._pass_turn(me)
        self.drained_to = ticket + 1
        return senders

    def free(self) -> None:
        self.win.free()
