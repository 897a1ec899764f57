"""p virtual ranks in one process, one running at a time, in the order of a simulated clock.

Each virtual rank is a thread that runs the unchanged training code of one MPI rank (``Run.work`` /
``Run.serve`` through ``methods/`` and ``train/``) against an ``InProcessTransport``.  Exactly one
of them runs at any moment (a baton: each thread waits on its own semaphore), so the ranks share
the process's memory and the scratch buffers of one model without a lock, and every run is
deterministic.

Time: every rank has a clock (simulated seconds).  A rank advances it when it computes
(``advance``: a step's compute, from the timeline) and when it waits (``block``: until a condition
of the shared state holds, e.g. a message has arrived, at the time it holds).  The scheduler always
runs the rank whose next action is earliest: a runnable rank at its clock, a blocked rank at the
time its condition became true (ties: the lower rank).  So every action happens when no other rank
can still produce an earlier event (conservative discrete-event simulation): a message is matched
to the earliest send that reached it, a read sees the publications made before it, in simulated
time.

A blocked rank whose condition can never hold while no rank can run is a deadlock: the world fails
with each rank's last ``doing`` note instead of hanging.  The first exception in any rank fails the
world: every other rank is woken with ``Aborted`` and the driver re-raises the first error.
"""
from __future__ import annotations

import threading
import time


class Aborted(BaseException):
    """Raised in a virtual rank's thread when another rank failed (not an error of its own)."""


class Deadlock(RuntimeError):
    """No virtual rank can run and some have not finished."""


class World:
    def __init__(self, size: int):
        self.size = size
        self.clock = [0.0] * size
        self.waiting: list = [None] * size      # None: runnable; else cond() -> time | None
        self.done = [False] * size
        self.doing = ["starting"] * size
        self.error: tuple[int, BaseException] | None = None
        self._sem = [threading.Semaphore(0) for _ in range(size)]
        self._main = threading.Semaphore(0)
        self._lock = threading.Lock()           # guards the hand-over (and the abort cascade)
        self._released_main = False
        self.switches = 0
        self.resumed = [0.0] * size             # real time each rank last got to run (perf_counter)

    # ------------------------------------------------------------------ driver
    def run(self, bodies, name: str = "vrank") -> None:
        """Runs ``bodies[r]()`` as rank r until every rank returned; re-raises the first error."""
        threads = [threading.Thread(target=self._body, args=(r, fn), name=f"{name}-{r}", daemon=True)
                   for r, fn in enumerate(bodies)]
        for t in threads:
            t.start()
        with self._lock:
            self._hand_over(None)
        self._main.acquire()
        for t in threads:
            t.join()
        if self.error is not None:
            raise self.error[1]

    def _body(self, r: int, fn) -> None:
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
                self._hand_over(r)

    # ------------------------------------------------------------------ ranks
    def advance(self, r: int, seconds: float) -> None:
        """Rank r spends ``seconds`` (compute); the ranks whose clocks are behind run first."""
        self.clock[r] += max(0.0, seconds)
        self._yield(r)

    def block(self, r: int, cond, doing: str = "") -> float:
        """Rank r waits until ``cond()`` returns a time (the condition holds since then); returns
        its clock, max(clock, that time).  ``cond`` is called by the scheduler on any thread and must
        only read the shared state."""
        if doing:
            self.doing[r] = doing
        self.waiting[r] = cond
        self._yield(r)
        return self.clock[r]

    def _yield(self, r: int) -> None:
        with self._lock:
            nxt = self._hand_over(r)
        if nxt != r and self.error is None:
            self._sem[r].acquire()
        if self.error is not None:
            raise Aborted()
        self.resumed[r] = time.perf_counter()

    # ------------------------------------------------------------------ scheduling
    def _pick(self):
        best = None
        for q in range(self.size):
            if self.done[q]:
                continue
            cond = self.waiting[q]
            if cond is None:
                t = self.clock[q]
            else:
                t = cond()
                if t is None:
                    continue
                t = max(t, self.clock[q])
            if best is None or t < best[0]:
                best = (t, q)
        return best

    def _hand_over(self, r) -> int | None:
        """Under the lock: wakes the next rank (returns it; r itself: keep running)."""
        if self.error is not None:              # abort cascade: wake everyone, then the driver
            for q in range(self.size):
                if not self.done[q] and q != r:
                    self._sem[q].release()
            self._finish_if_done()
            return None
        best = self._pick()
        if best is None:
            if not all(self.done):
                self.error = (-1, Deadlock(self._deadlock_message()))
                return self._hand_over(r)
            self._finish_if_done()
            return None
        t, q = best
        self.clock[q], self.waiting[q] = t, None
        if q != r:
            self.switches += 1
            self._sem[q].release()
        return q

    def _finish_if_done(self) -> None:
        if all(self.done) and not self._released_main:
            self._released_main = True
            self._main.release()

    def _deadlock_message(self) -> str:
        stuck = [f"rank {q} at {self.clock[q]:.3f} s: {self.doing[q]}"
                 for q in range(self.size) if not self.done[q]]
        return "virtual cluster deadlock: no rank can run; " + "; ".join(stuck)
