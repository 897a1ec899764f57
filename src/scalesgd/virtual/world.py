"""p virtual ranks in one process, one running at a time, in the order of a simulated clock.

Each virtual rank is a thread that runs the unchanged training code of one MPI rank (``Run.work`` /
``Run.serve`` through ``methods/`` and ``train/``) against an ``InProcessTransport``.  Exactly one
participant runs at any moment (a baton: each thread waits on its own semaphore), so the ranks
share the process's memory and the scratch buffers of one model without a lock, and every run is
deterministic.  Besides the ranks, a rank may add *helpers* (``add``: the communication thread of
overlapped gossip); a helper has its own clock, runs under the same baton, and does not keep the
world alive (daemon).

Time: every participant has a clock (simulated seconds).  It advances when it computes
(``advance``: a step's compute, from the timeline) and when it waits: ``block`` (until a condition
of the shared state holds, e.g. a message has arrived, at the time it holds), or ``park`` (until
another participant ``wake``s it at a time it names: a collective's last arrival wakes the others,
so p waiting ranks cost the scheduler nothing until then).  The scheduler always runs the
participant whose next action is earliest: a runnable one at its clock, a blocked one at the time
its condition became true, a woken one at its wake time (ties: the lower index).  Runnable and
woken participants sit in a heap; only blocked ones' conditions are evaluated at each hand-over,
so a hand-over costs O(log p) plus the conditions, not O(p).  So every action happens when no other
participant can still produce an earlier event (conservative discrete-event simulation): a message
is matched to the earliest send that reached it, a read sees the publications made before it, in
simulated time.  ``me()`` is the participant the calling thread runs as.

A state where ranks wait for something no participant can do any more is a deadlock: the world
fails with each one's last ``doing`` note instead of hanging.  The first exception in any
participant fails the world: every other one is woken with ``Aborted`` and the driver re-raises
the first error.
"""
from __future__ import annotations

import heapq
import threading
import time

PARKED = "parked"                               # waiting for a wake(), not scanned


class Aborted(BaseException):
    """Raised in a participant's thread when another one failed (not an error of its own)."""


class Deadlock(RuntimeError):
    """No participant can run and some rank has not finished."""


class World:
    def __init__(self, size: int):
        self.size = size                        # ranks; helpers are numbered from size on
        self.clock = [0.0] * size
        self.waiting: list = [None] * size      # None: runnable; cond() -> time | None; PARKED;
                                                # or a float: woken for that time
        self.done = [False] * size
        self.daemon = [False] * size
        self.doing = ["starting"] * size
        self.resumed = [0.0] * size             # real time each one last got to run (perf_counter)
        self.error: tuple[int, BaseException] | None = None
        self._sem = [threading.Semaphore(0) for _ in range(size)]
        self._threads: list[threading.Thread] = []
        self._main = threading.Semaphore(0)
        self._lock = threading.Lock()           # guards the hand-over (and the abort cascade)
        self._local = threading.local()
        self._released_main = False
        self.switches = 0
        self._heap: list = []                   # (time, index, generation): runnable or woken
        self._gen = [0] * size                  # an entry is live while its generation is current
        self._conds: set = set()                # participants blocked on a condition
        for r in range(size):
            self._push(r, 0.0)

    # ------------------------------------------------------------------ driver
    def run(self, bodies, name: str = "vrank") -> None:
        """Runs ``bodies[r]()`` as rank r until every rank returned; re-raises the first error."""
        for r, fn in enumerate(bodies):
            self._start(r, fn, f"{name}-{r}")
        with self._lock:
            self._hand_over(None)
        while not self._main.acquire(timeout=0.2):    # wakes so that Ctrl-C's handler runs promptly
            pass
        for t in self._threads[:self.size]:       # (an idle helper may wait for ever: a daemon)
            t.join()
        if self.error is not None:
            raise self.error[1]

    def add(self, fn, name: str, daemon: bool = True) -> int:
        """From a running participant: a helper that runs ``fn()`` from the caller's clock on; its
        index.  It runs once the scheduler picks it (the caller keeps the baton until it waits)."""
        with self._lock:
            i = len(self.clock)
            self.clock.append(self.clock[self.me()])
            self.waiting.append(None)
            self.done.append(False)
            self.daemon.append(daemon)
            self.doing.append("starting")
            self.resumed.append(0.0)
            self._sem.append(threading.Semaphore(0))
            self._gen.append(0)
            self._push(i, self.clock[i])
        self._start(i, fn, name)
        return i

    def _start(self, i: int, fn, name: str) -> None:
        t = threading.Thread(target=self._body, args=(i, fn), name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def me(self) -> int:
        """The participant the calling thread runs as."""
        return self._local.me

    def _body(self, r: int, fn) -> None:
        self._local.me = r
        self._sem[r].acquire()
        self.resumed[r] = time.perf_counter()
        try:
            if self.error is None:
                fn()
        except Aborted:
            pass
        except BaseException as exc:            # the first one fails the world
            with self._lock:
                if self.error is None:
                    self.error = (r, exc)
        finally:
            with self._lock:
                self.done[r] = True
                self.waiting[r] = None
                self._gen[r] += 1
                self._conds.discard(r)
                self._hand_over(r)

    # ------------------------------------------------------------------ participants
    def advance(self, r: int, seconds: float) -> None:
        """Participant r spends ``seconds`` (compute); those whose clocks are behind run first."""
        self.clock[r] += max(0.0, seconds)
        self._yield(r)

    def block(self, r: int, cond, doing: str = "") -> float:
        """Participant r waits until ``cond()`` returns a time (the condition holds since then);
        returns its clock, max(clock, that time).  ``cond`` is called by the scheduler on any
        thread and must only read the shared state."""
        if doing:
            self.doing[r] = doing
        self.waiting[r] = cond
        self._yield(r)
        return self.clock[r]

    def park(self, r: int, doing: str = "") -> float:
        """Participant r waits until another one ``wake``s it; returns its clock, max(clock, the
        wake time)."""
        if doing:
            self.doing[r] = doing
        self.waiting[r] = PARKED
        self._yield(r)
        return self.clock[r]

    def wake(self, q: int, t: float) -> None:
        """From the running participant: parked ``q`` may go on from time ``t``."""
        self.waiting[q] = t
        self._push(q, max(t, self.clock[q]))

    def wait_until(self, r: int, t: float, doing: str = "") -> float:
        """Participant r waits until time ``t`` (as if woken for it: ``block`` with a constant)."""
        if doing:
            self.doing[r] = doing
        self.waiting[r] = t
        self._push(r, max(t, self.clock[r]))
        self._yield(r)
        return self.clock[r]

    def _push(self, q: int, t: float) -> None:
        self._gen[q] += 1
        heapq.heappush(self._heap, (t, q, self._gen[q]))

    def _yield(self, r: int) -> None:
        with self._lock:
            w = self.waiting[r]
            if w is None:                       # still runnable: at its clock
                self._push(r, self.clock[r])
            elif callable(w):
                self._gen[r] += 1
                self._conds.add(r)
            elif w is PARKED:
                self._gen[r] += 1
            nxt = self._hand_over(r)
        if nxt != r and self.error is None:
            self._sem[r].acquire()
        if self.error is not None:
            raise Aborted()
        self.resumed[r] = time.perf_counter()

    # ------------------------------------------------------------------ scheduling
    def _pick(self):
        heap, gen = self._heap, self._gen
        while heap and (heap[0][2] != gen[heap[0][1]] or self.done[heap[0][1]]):
            heapq.heappop(heap)                 # stale: it ran, blocked or finished since
        best = (heap[0][0], heap[0][1]) if heap else None
        for q in self._conds:
            t = self.waiting[q]()
            if t is None:
                continue
            t = max(t, self.clock[q])
            if best is None or (t, q) < best:
                best = (t, q)
        return best

    def _ranks_done(self) -> bool:
        return all(d for d, daemon in zip(self.done, self.daemon) if not daemon)

    def _hand_over(self, r) -> int | None:
        """Under the lock: wakes the next participant (returns it; r itself: keep running)."""
        if self.error is not None:              # abort cascade: wake everyone, then the driver
            for q in range(len(self.clock)):
                if not self.done[q] and q != r:
                    self._sem[q].release()
            self._finish_if_done()
            return None
        best = self._pick()
        if best is None:
            if not self._ranks_done():
                self.error = (-1, Deadlock(self._deadlock_message()))
                return self._hand_over(r)
            self._finish_if_done()
            return None
        t, q = best
        self.clock[q], self.waiting[q] = t, None
        self._gen[q] += 1                       # running: its heap entries are stale
        self._conds.discard(q)
        if q != r:
            self.switches += 1
            self._sem[q].release()
        return q

    def _finish_if_done(self) -> None:
        if not self._released_main and (all(self.done) or (self.error is None and self._ranks_done())):
            self._released_main = True
            self._main.release()

    def _deadlock_message(self) -> str:
        stuck = [f"{'rank' if q < self.size else 'helper'} {q} at {self.clock[q]:.3f} s: {self.doing[q]}"
                 for q in range(len(self.clock)) if not self.done[q]]
        return "virtual cluster deadlock: no rank can run; " + "; ".join(stuck)
