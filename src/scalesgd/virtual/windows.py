"""The gossip windows and the communication thread of a virtual rank: ``comm/mpi/window.py``'s
``PublishedVector``, ``Inbox``, ``SampleCounter`` and ``Courier`` in one process (see
``transport.py`` for the timing, ``replay.py`` for the recorded order they follow)."""
from __future__ import annotations

import numpy as np

from ..comm.jobs import CourierJobs
from .cluster import Endpoint


class VirtualCourier(CourierJobs):
    """``comm.mpi.window.Courier`` for a virtual rank: one job at a time, run by a helper participant
    with its own clock (from the time it was submitted), so the job's communication overlaps the
    rank's next compute in simulated time; ``wait`` blocks the rank until the job's end.  While
    idle it counts as progressing MPI (``Cluster.progressing``: no one-sided call to this rank
    waits for its compute)."""

    def __init__(self, net: Endpoint):
        self.net, self.world = net, net.world
        self.busy_seconds = self.exposed_seconds = 0.0
        self.jobs = 0
        self._job, self._closed = None, False
        self._submitted = self._finished = 0.0
        self.id = self.world.add(self._run, f"vcourier-{net.wr}")

    def submit(self, fn, *args) -> None:
        assert self._state == "idle" and not self._closed, "one job at a time, on an open courier"
        self._state, self._job, self._submitted = "queued", (fn, args), self.net.clock()

    def wait(self):
        t = self.net.clock()
        self.net._wait(lambda: None if self._state in ("queued", "running") else self._finished,
                       "waiting for the communication thread")
        if self._state == "idle":
            return None
        return self._collect(self.net.clock() - t)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._closed = True
            self.net.c.progressing.discard(self.net.wr)

    def _run(self) -> None:
        w, me = self.world, self.id
        while True:
            w.block(me, lambda: self._submitted if self._state == "queued" else
                    (w.clock[me] if self._closed else None), "communication thread idle")
            if self._state != "queued":
                return
            self._state, t = "running", w.clock[me]
            fn, args = self._job
            try:
                out = (fn(*args), None)
            except Exception as exc:       # (Aborted is not an Exception: it ends the helper)
                out = (None, exc)
            self.busy_seconds += w.clock[me] - t
            self.jobs += 1
            self._result, self._finished, self._state = out, w.clock[me], "done"


class VirtualPublishedVector:
    """Every rank's latest publication (a copy) and its version; a read copies the target's."""

    def __init__(self, net: Endpoint, n: int, dtype):
        self.net, self.n, self.dtype = net, int(n), np.dtype(dtype)
        self.shared = net.c.windows.setdefault(("pub", net.key), {})
        self.shared[net.rank] = {"version": 0, "t": 0.0, "data": np.zeros(self.n, self.dtype)}
        self.published = 0
        self.waited = 0.0
        self.reads = 0

    def publish(self, x) -> int:
        n, me = self.net, self.shared[self.net.rank]
        replay = n.c.replay
        if replay is not None:         # the readers of the current version read it first
            n._wait(lambda: me["t"] if replay.reads_left(n.wr, me["version"]) == 0 else None,
                    f"publishing version {me['version'] + 1} (replay: readers of "
                    f"version {me['version']} first)")
        np.copyto(me["data"], x, casting="same_kind")
        self.published += 1                        # (a resumed run sets it: versions continue)
        me["version"], me["t"] = self.published, n.clock()
        return self.published

    def read(self, target: int, out, poll=None) -> tuple[int, int]:
        n = self.net
        theirs = self.shared[target]
        replay, want = n.c.replay, None
        if replay is not None:
            want = replay.next_read(n.wr, self.reads, target)
            if want is not None:       # (past the trace's end: a read the run never mixed in)
                n._wait(lambda: theirs["t"] if theirs["version"] == want else None,
                        f"reading version {want} of rank {target}'s copy (replay)")
        t = n.target_ready(n.group[target], n.clock())
        arrival = n.c.net.send(n.group[target], n.wr, out.nbytes, t + n.c.net.lat)
        version = theirs["version"]
        out[...] = theirs["data"]
        if replay is not None and want is not None:
            replay.did_read(n.group[target], version)
        self.reads += 1
        n._wait(lambda: arrival, f"reading rank {target}'s copy")
        n.advance(n.c.net.apply_seconds(out.nbytes))      # the mix
        return version, 0

    def free(self) -> None:
        pass

    @property
    def win(self):
        return self

    def flush_all(self) -> None:
        """Every one-sided call of this rank has completed when its call returned."""


class VirtualInbox:
    """Push-sum inboxes: messages (copies) with the times they become drainable; a drain sums
    those that are, in that order, from zeros (as ``comm/mpi/inbox.py``'s whole messages, added turn
    by turn into a zeroed sum), and returns their senders in that order.  A push costs, besides
    its transfer, the two round trips of its turn at the target (the ticket, and passing the turn
    on after the flushed message: ``Inbox.push``); the waits for a turn held by another sender
    are the target NIC's queue.  A replay drains the messages the run's drain took, in the order
    it recorded (an older trace without the order: each sender's oldest, by arrival)."""

    def __init__(self, net: Endpoint, n: int, dtype):
        self.net, self.n, self.dtype = net, int(n), np.dtype(dtype)
        self.shared = net.c.windows.setdefault(("inbox", net.key), {})
        self.shared[net.rank] = []
        self.waited = 0.0
        self.drains = 0

    def push(self, target: int, msg, poll=None) -> None:
        n, dst = self.net, self.net.group[target]
        rt = 2 * n.c.net.lat if n.c.net.node(n.wr) != n.c.net.node(dst) else 0.0
        turn = n.target_ready(dst, n.clock()) + rt               # the ticket: a round trip
        arrival = n.c.net.send(n.wr, dst, msg.nbytes, turn)
        self.shared[target].append((arrival + rt / 2, n.rank, msg.copy()))   # the turn passed on
        n._wait(lambda: arrival + rt, f"pushing to rank {target}")

    def flush(self) -> None:
        pass

    def drain(self, out, locked: bool = True) -> list[int] | None:
        n = self.net
        box = self.shared[n.rank]
        want = n.c.replay.next_drain(n.wr, self.drains) if n.c.replay is not None else None
        self.drains += 1
        if want is not None:           # replay: exactly the messages the run's drain folded
            got, order = want

            def arrived():
                times = []
                for s, c in got.items():
                    have = [m[0] for m in box if m[1] == s][:c]
                    if len(have) < c:
                        return None
                    times += have
                return max(times, default=0.0)
            n._wait(arrived, f"draining the inbox (replay: {got})")
            here = []
            if order is None:          # each sender's oldest messages (one origin's order holds)
                left = dict(got)
                for m in box:
                    if left.get(m[1], 0) > 0:
                        here.append(m)
                        left[m[1]] -= 1
                here.sort(key=lambda m: (m[0], m[1]))
            else:                      # in the recorded order, each sender's oldest first
                for s in order:
                    here.append(next(m for m in box if m[1] == s and not any(m is h for h in here)))
            box[:] = [m for m in box if not any(m is h for h in here)]
        else:
            now = n.clock()
            here = sorted((m for m in box if m[0] <= now), key=lambda m: (m[0], m[1]))
            box[:] = [m for m in box if m[0] > now]
        out[...] = 0
        for _, _, msg in here:
            out += msg
        n.advance(n.c.net.apply_seconds(out.nbytes))      # the fold
        if want is not None and want[1] is None:
            return None                # (as the older trace it replays: no order recorded)
        return [m[1] for m in here]

    def free(self) -> None:
        pass

    win = VirtualPublishedVector.win
    flush_all = VirtualPublishedVector.flush_all


class VirtualSampleCounter:
    """The global sample count and the signals, on ``root``; an update is a round trip to it."""

    def __init__(self, net: Endpoint, root: int = 0):
        self.net, self.root = net, root
        self.shared = net.c.windows.setdefault(("counter", net.key),
                                               {"total": 0, "t": 0.0, "sig": np.zeros(2, np.int64)})
        self.waited = 0.0
        self.adds = 0

    def add(self, k: int, raised=None, poll=None):
        n, sh = self.net, self.shared
        replay = n.c.replay
        t0 = n.clock()
        if replay is not None and k:           # (a checkpoint's add of 0 is not an exchange)
            old = replay.next_count(n.wr, self.adds)
            if old is not None:
                n._wait(lambda: sh["t"] if sh["total"] == old else None,
                        f"updating the sample counter after {old} (replay)")
        root = n.group[self.root]
        rt = 2 * n.c.net.lat if n.c.net.node(n.wr) != n.c.net.node(root) else 0.0
        start = n.target_ready(root, n.clock())
        n._wait(lambda: start + rt, "updating the sample counter")
        sh["total"] += int(k)
        sh["t"] = n.clock()
        self.adds += int(bool(k))
        mine = np.zeros(2, np.int64) if raised is None else np.asarray(raised, np.int64)
        before = sh["sig"].copy()
        np.maximum(sh["sig"], mine, out=sh["sig"])
        self.waited += n.clock() - t0
        return sh["total"], np.maximum(before, mine)

    def set(self, total: int) -> None:
        self.shared["total"] = int(total)

    def free(self) -> None:
        pass

    win = VirtualPublishedVector.win
    flush_all = VirtualPublishedVector.flush_all
