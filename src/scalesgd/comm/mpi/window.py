"""One-sided (RMA) windows for gossip: owned objects, created once (collective), freed once (collective).

Every window is ``MPI.Win.Allocate``d (MPI owns the memory: on one node MPICH maps it shared, so a
``Get`` is a copy by the origin and never needs the target to enter MPI; ``Win.Create`` over a NumPy
array did, and was 2-20x slower) and is opened with ONE ``Lock_all(MODE_NOCHECK)`` epoch for its whole
life.  No checked lock is ever taken (a checked lock waits for a busy target, and mixing NOCHECK and
checked exclusive locks on one window hung MPICH 5.0.2).  Every blocking RMA call is followed by
``Flush`` of its target before it returns.  The request-based calls of gossip's communication thread
(``Raccumulate``, ``Rget_accumulate``) complete locally only, so their data may still be on its way
when the caller goes on: ``Gossip.quiesce`` flushes every window (then a barrier) before a
checkpoint reads the inboxes, and ``Win.Free`` flushes at the end; an evaluation in between
averages the parameters, which those calls do not touch.

``MODE_NOCHECK`` means MPI does not serialise readers and writers: consistency comes from the
protocols below, where each rank writes only its own memory with local stores (``PublishedVector``)
or all writers use accumulate operations, which are element-wise atomic w.r.t. each other
(``SampleCounter``; push-sum's ``inbox.Inbox`` builds whole-message turns from them).

- ``PublishedVector``: a seqlock over two halves; the owner publishes, anyone reads a consistent copy.
- ``SampleCounter``: one int64 on a root rank, ``Fetch_and_op(SUM)``.
- ``comm/mpi/inbox.py: Inbox`` (push-sum): others add whole messages, the owner drains them, in turns.

Each counts ``waited``: cumulative seconds its calls were blocked on another rank rather than
moving their own data (what the methods report as ``wait_seconds``): a ``PublishedVector`` read's
failed tries (the owner was publishing that half), the whole of a ``SampleCounter`` update (16
bytes: its time is the atomics' serialisation at the root, and across nodes the root's progress),
and an ``Inbox`` push's or drain's wait for its turn (see docs/methods.md).

Overlap (gossip's ``dist.gossip_overlap``): a ``Courier`` is a communication thread that runs one
exchange at a time while the caller computes.  Its calls are request-based (``Rget`` /
``Raccumulate`` / ``Rget_accumulate``, ``poll`` seconds given) and completed by ``MPI_Test`` with
sleeps in between, not by ``Flush``/``Wait``: MPICH's blocking completion spins a core, and on the
network path a call may wait a whole step for its target to enter MPI.  Idle, the courier runs
MPI's progress engine every ``IDLE_POLL_SECONDS`` so that other ranks' calls aimed at this rank
complete meanwhile.  mpi4py releases the GIL inside every MPI call and ``time.sleep`` does too; each
wake-up still needs the GIL for a moment (costs measured in docs/benchmarks.md).  A request-based
accumulate completes *locally* (its buffer is free); ``flush_all`` completes it at the target,
which push-sum needs before it counts mass.  Needs ``MPI_THREAD_MULTIPLE``.
"""
from __future__ import annotations

import threading
import time

import numpy as np
from mpi4py import MPI

from ..jobs import IDLE_POLL_SECONDS, CourierJobs

HEADER_BYTES = 64          # two int64 sequence numbers, padded so the data halves stay cache-line aligned


def settle(req, poll: float | None) -> None:
    """Completes request ``req``: ``Wait`` (poll None), or ``Test`` every ``poll`` seconds with the GIL
    and the CPU given up in between (each Test also runs MPI's progress engine for this rank, so
    other ranks' calls aimed at it progress too)."""
    if poll is None:
        req.Wait()
        return
    while not req.Test():
        time.sleep(poll)


class Window:
    """``nbytes`` of MPI-allocated memory on this rank (``disp_unit`` bytes per displacement unit),
    zeroed, inside one ``Lock_all(MODE_NOCHECK)`` epoch until ``free()``.  Collective to create."""

    def __init__(self, comm, nbytes: int, disp_unit: int = 1):
        self.comm, self.rank = comm, comm.Get_rank()
        self.win = MPI.Win.Allocate(int(nbytes), disp_unit, comm=comm)
        self.mem = np.frombuffer(self.win.tomemory(), dtype=np.uint8)
        self.mem[...] = 0
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.win.Sync()
        comm.Barrier()             # nobody touches a window before every rank has zeroed its memory

    def view(self, offset: int, count: int, dtype) -> np.ndarray:
        """This rank's own memory at byte ``offset`` as ``count`` items of ``dtype`` (aliases it)."""
        dt = np.dtype(dtype)
        return self.mem[offset:offset + count * dt.itemsize].view(dt)

    # every call below completes (Flush) before returning; with ``poll`` (from a courier) the
    # request-based form is completed by polling instead (see ``settle``)
    def get(self, out: np.ndarray, target: int, disp: int = 0, poll: float | None = None) -> None:
        if poll is not None:
            settle(self.win.Rget(out, target, target=disp), poll)
            return
        self.win.Get(out, target, target=disp)
        self.win.Flush(target)

    def accumulate(self, data: np.ndarray, target: int, disp: int = 0, op=MPI.SUM,
                   poll: float | None = None) -> None:
        """With ``poll``: returns at LOCAL completion (``data`` may be reused; the target may not
        have it yet: ``flush_all`` completes it there)."""
        if poll is not None:
            settle(self.win.Raccumulate(data, target, target=disp, op=op), poll)
            return
        self.win.Accumulate(data, target, target=disp, op=op)
        self.win.Flush(target)

    def get_accumulate(self, data: np.ndarray, result: np.ndarray, target: int, disp: int = 0,
                       op=MPI.SUM, poll: float | None = None) -> None:
        """With ``poll``: returns once ``result`` holds the value before the operation (atomic
        with it; ``flush_all`` completes it at the target in the MPI standard's sense)."""
        if poll is not None:
            settle(self.win.Rget_accumulate(data, result, target, target=disp, op=op), poll)
            return
        self.win.Get_accumulate(data, result, target, target=disp, op=op)
        self.win.Flush(target)

    def fetch_and_op(self, value: np.ndarray, result: np.ndarray, target: int, disp: int = 0,
                     op=MPI.SUM, poll: float | None = None) -> None:
        """One element; with ``poll``, the request-based ``Rget_accumulate`` of it (MPI has no
        request-based Fetch_and_op)."""
        if poll is not None:
            self.get_accumulate(value[:1], result[:1], target, disp, op, poll)
            return
        self.win.Fetch_and_op(value, result, target, disp, op=op)
        self.win.Flush(target)

    def sync(self) -> None:
        """Memory barrier between this rank's local stores into its window (``MPI_Win_sync``)."""
        self.win.Sync()

    def flush_all(self) -> None:
        """Completes, at their targets, every operation this rank started on the window."""
        self.win.Flush_all()

    def free(self) -> None:
        """Collective: ends the epoch and frees the memory.  Idempotent."""
        if self.win is None:
            return
        self.mem = None
        self.win.Flush_all()
        self.win.Unlock_all()
        self.win.Free()
        self.win = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class TornReadError(RuntimeError):
    """A reader could not get a consistent copy in ``max_tries`` attempts (writer far faster)."""


class PublishedVector:
    """A vector of ``n`` items of ``dtype`` that its owner republishes and anyone reads, lock-free.

    Layout of each rank's window (bytes)::

        [0, 8)      seq[0]  int64     sequence number of half 0
        [8, 16)     seq[1]  int64     sequence number of half 1
        [16, 64)    padding
        [64, 64+B)  half 0  n x dtype (B = n * itemsize)
        [64+B, 64+2B) half 1

    Publication k (k = 1, 2, ...) goes to half h = k % 2: seq[h] = 2k-1 (odd: being written),
    ``Win_sync``, copy, ``Win_sync``, seq[h] = 2k (even: complete), ``Win_sync``.  The other half keeps
    publication k-1 intact all the while, so the latest complete copy is the half with the largest
    even seq.  A reader Gets both seqs, then for the candidate half: Get data, Flush, Get seq again,
    Flush; equal and even -> consistent (the writer did not touch that half during the copy), else it
    tries the other half / re-reads the header (a "torn read retry").  Only the owner ever writes.
    """

    def __init__(self, comm, n: int, dtype, max_tries: int = 10000):
        self.n, self.dtype = int(n), np.dtype(dtype)
        self.half_bytes = self.n * self.dtype.itemsize
        self.max_tries = max_tries
        self.win = Window(comm, HEADER_BYTES + 2 * self.half_bytes)
        self.seq = self.win.view(0, 2, np.int64)
        self.halves = [self.win.view(self._offset(h), self.n, self.dtype) for h in (0, 1)]
        self.published = 0                          # k of the last publication
        self._hdr, self._s = np.zeros(2, np.int64), np.zeros(1, np.int64)
        self.waited = 0.0                           # seconds in failed tries of read()

    def _offset(self, h: int) -> int:
        return HEADER_BYTES + h * self.half_bytes

    def publish(self, x: np.ndarray) -> int:
        """Copies host array ``x`` into the half not holding the latest copy; returns its version."""
        k = self.published + 1
        h = k % 2
        self.seq[h] = 2 * k - 1
        self.win.sync()
        np.copyto(self.halves[h], x, casting="same_kind")
        self.win.sync()
        self.seq[h] = 2 * k
        self.win.sync()
        self.published = k
        return k

    def read(self, target: int, out: np.ndarray, poll: float | None = None) -> tuple[int, int]:
        """A consistent copy of ``target``'s latest publication into ``out`` (scratch: a failed try
        leaves garbage in it).  Returns (version, torn-read retries).  Never waits for the target;
        the time of failed tries (a torn copy, or no complete half) is added to ``waited``.
        ``poll``: from a courier, each of the three reads is request-based and polled (``settle``);
        the seq check still follows the data's completion, so the same proof holds."""
        assert out.dtype == self.dtype and out.size == self.n and out.flags.c_contiguous
        retries = 0
        t = time.perf_counter()
        for _ in range(self.max_tries):
            self.win.get(self._hdr, target, 0, poll)
            for h in sorted((0, 1), key=lambda h: -self._hdr[h]):
                s = int(self._hdr[h])
                if s <= 0 or s % 2:                 # never published / being written now
                    continue
                self.win.get(out, target, self._offset(h), poll)
                self.win.get(self._s, target, 8 * h, poll)
                if int(self._s[0]) == s:
                    return s // 2, retries
                retries += 1
                t = self._count_wait(t)             # a torn copy: the owner was writing it
            t = self._count_wait(t)                 # no consistent half under this header
        raise TornReadError(f"no consistent copy of rank {target}'s vector after {self.max_tries} "
                            f"header reads ({retries} torn reads; seq {self._hdr.tolist()})")

    def _count_wait(self, since: float) -> float:
        now = time.perf_counter()
        self.waited += now - since
        return now

    def free(self) -> None:
        self.win.free()


class SampleCounter:
    """int64[3] in ``root``'s window: the global sample count, then the signals (stop, checkpoint
    generation), max-merged.

    ``add(k, raised)`` atomically adds k to the count (``Fetch_and_op`` SUM) and merges this rank's
    raised signals (``Get_accumulate`` MAX, which returns the previous ones); returns (new total,
    signals seen).  Its whole time is added to ``waited`` (two 8-byte atomics: nothing to transfer;
    they wait for the root's window, serialised with every other rank's update)."""

    def __init__(self, comm, root: int = 0):
        self.root = root
        self.win = Window(comm, 24 if comm.Get_rank() == root else 0, disp_unit=8)
        self._v, self._r = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self._sig = np.zeros(2, np.int64)
        self.waited = 0.0

    def add(self, k: int, raised=None, poll: float | None = None) -> tuple[int, np.ndarray]:
        """``poll``: from a courier (request-based calls completed by polling)."""
        t = time.perf_counter()
        self._v[0] = k
        self.win.fetch_and_op(self._v, self._r, self.root, 0, MPI.SUM, poll)
        total = int(self._r[0]) + k
        mine = np.zeros(2, np.int64) if raised is None else np.array(raised, np.int64)
        self.win.get_accumulate(mine, self._sig, self.root, 1, MPI.MAX, poll)
        self.waited += time.perf_counter() - t
        return total, np.maximum(self._sig, mine)

    def set(self, total: int) -> None:
        """While no other rank uses the counter (a restore): sets the count."""
        self._v[0] = total
        self.win.fetch_and_op(self._v, self._r, self.root, 0, MPI.REPLACE)

    def free(self) -> None:
        self.win.free()


class Courier(CourierJobs):
    """A communication thread that runs one job at a time (``submit``) while the caller computes;
    ``wait`` returns the job's value (or raises its exception) once it is done.

    A job goes idle -> queued (``submit``) -> running (the thread) -> done -> idle (``wait``); at most
    one is in flight, and the caller touches none of its buffers between ``submit`` and ``wait``.
    Seconds: ``busy_seconds`` the jobs ran (communication taken off the caller's path),
    ``exposed_seconds`` the caller was blocked in ``wait`` (the part that was not hidden).  A job's
    MPI calls should pass ``poll`` (``POLL_SECONDS``) so that the thread never spins."""

    def __init__(self, progress=None, idle_poll: float | None = IDLE_POLL_SECONDS,
                 name: str = "scalesgd-courier"):
        """``progress``: None, or a callable that runs MPI's progress engine once (an ``Iprobe``),
        called every ``idle_poll`` seconds while no job runs: other ranks' one-sided calls aimed at
        this rank then complete while its main thread computes, not at its next MPI call."""
        self.progress, self.idle_poll = progress, idle_poll
        self.busy_seconds = self.exposed_seconds = 0.0
        self.jobs = 0
        self._cv = threading.Condition()
        self._job, self._closed = None, False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> None:
        """Starts ``fn(*args)`` on the thread; the previous job must have been collected."""
        with self._cv:
            assert self._state == "idle" and not self._closed, "one job at a time, on an open courier"
            self._state, self._job = "queued", (fn, args)
            self._cv.notify_all()

    def wait(self):
        """Blocks until the job is done; returns its value (None when none was submitted)."""
        t = time.perf_counter()
        with self._cv:
            while self._state in ("queued", "running"):
                self._cv.wait()
            if self._state == "idle":
                return None
            return self._collect(time.perf_counter() - t)

    def close(self) -> None:
        """Collects the job in flight (raising its error), then ends the thread.  Idempotent."""
        try:
            self.wait()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._thread.join()

    def _run(self) -> None:
        idle = self.idle_poll if self.progress is not None else None
        while True:
            with self._cv:
                if self._state != "queued" and not self._closed:
                    self._cv.wait(idle)
                if self._closed:
                    return
                job = None
                if self._state == "queued":
                    job, self._job, self._state = self._job, None, "running"
            if job is not None:
                self._execute(*job)
            elif idle is not None:            # idle: progress for the others' calls aimed here
                try:
                    self.progress()
                except Exception as e:  # noqa: BLE001 - (a dead rank, under ULFM): the thread lives
                    self.idle_error, idle = e, None   # on for jobs; the caller raises it (collect)

    def _execute(self, fn, args) -> None:
        t = time.perf_counter()
        try:
            out = (fn(*args), None)
        except BaseException as e:            # handed to the caller's wait()
            out = (None, e)
        with self._cv:
            self.busy_seconds += time.perf_counter() - t
            self.jobs += 1
            self._result, self._state = out, "done"
            self._cv.notify_all()
