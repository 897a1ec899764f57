"""The in-process transport: what ``comm/transport.MPITransport`` does, for virtual ranks.

Same surface, same arithmetic: collectives combine the ranks' buffers in rank order (sums in the
pairwise tree MPICH's all-reduce uses: ((x0 + x1) + (x2 + x3)) for p = 4, measured), the
parameter-server endpoints copy headers and payload slices between the ranks' own buffers, the
gossip windows hold each rank's published copy, inbox and the shared sample counter.  What MPI
leaves to the network (which push a server takes next, which publication a read sees, in which
order the counter is updated) is decided by the timeline: the earliest event in simulated time
(``model``), or the order a real run recorded (``replay``: ``Replay``).

Timing (``Cluster.net``, from a ``profile.Profile``): a message occupies the sender's and the
receiver's NIC for bytes / link rate (FIFO per node: a server's NIC serialises its workers'
pushes), plus the latency; ranks on one node (``ranks_per_node``) exchange at the intra-node
rate.  Collectives cost the ring all-reduce time (2 (n-1)/n bytes / rate + 2 (n-1) latencies over
n nodes) once the last rank has arrived.  A one-sided read is a round trip; an accumulate and the
counter update wait for their completion at the target (as the flushed MPI calls do).  Not
modelled: one-sided calls waiting for a busy target to enter MPI (docs/cluster.md) — the virtual
ranks behave as if MPI progressed asynchronously.
"""
from __future__ import annotations

import numpy as np

import time

from ..comm.protocol import PushHeader, ReplyHeader, Tag, header


def tree_sum(arrays: list) -> np.ndarray:
    """Sum of same-shaped arrays in MPICH's all-reduce order: pairs of neighbours, then pairs of
    pairs (recursive doubling); with p not a power of two, ranks 2i and 2i+1 (i < p - 2^k) are
    folded first.  A new array."""
    vals = [np.array(a, copy=True) for a in arrays]
    p = len(vals)
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    if rem:
        vals = [vals[2 * i] + vals[2 * i + 1] for i in range(rem)] + vals[2 * rem:]
    while len(vals) > 1:
        vals = [vals[i] + vals[i + 1] for i in range(0, len(vals), 2)]
    return vals[0]


class Net:
    """Link and NIC timing of the virtual cluster (see the module doc)."""

    def __init__(self, profile, size: int):
        self.p = profile
        self.rpn = max(1, int(profile.ranks_per_node))
        nodes = -(-size // self.rpn)
        self.out_free = [0.0] * nodes
        self.in_free = [0.0] * nodes
        self.bps = profile.link_gbps * 1e9 / 8
        self.intra_bps = profile.intra_gbps * 1e9 / 8
        self.lat = profile.latency_us * 1e-6
        self.bytes_sent = [0] * nodes

    def node(self, r: int) -> int:
        return r // self.rpn

    def send(self, src: int, dst: int, nbytes: int, t: float) -> float:
        """Arrival time at ``dst`` of ``nbytes`` sent by ``src`` at ``t`` (NICs updated)."""
        a, b = self.node(src), self.node(dst)
        if a == b:
            return t + nbytes / self.intra_bps + self.lat * 0.1
        tx = nbytes / self.bps
        start = max(t, self.out_free[a])
        self.out_free[a] = start + tx
        into = max(start, self.in_free[b])
        self.in_free[b] = into + tx
        self.bytes_sent[a] += nbytes
        return into + tx + self.lat

    def collective_seconds(self, nbytes: int, group) -> float:
        """Ring all-reduce of ``nbytes`` over the nodes of ``group`` (within a node: its rate)."""
        nodes = len({self.node(r) for r in group})
        if len(group) == 1:
            return 0.0
        if nodes == 1:
            n = len(group)
            return 2 * (n - 1) / n * nbytes / self.intra_bps
        return 2 * (nodes - 1) / nodes * nbytes / self.bps + 2 * (nodes - 1) * self.lat

    def apply_seconds(self, nbytes: int) -> float:
        """Arithmetic over a flat buffer on the device (a server's update, a gossip mix): three
        passes at the profile's memory rate."""
        return 3 * nbytes / (self.p.mem_gbps * 1e9)


class Cluster:
    """The shared state of p virtual ranks: the world (clocks, scheduler), the network, the
    collectives in progress, mailboxes and windows, and the replay's recorded order."""

    def __init__(self, world, profile, replay=None):
        self.world, self.profile, self.replay = world, profile, replay
        self.net = Net(profile, world.size)
        self.seq: dict = {}          # (group, world rank) -> collectives entered
        self.slots: dict = {}        # (group, seq) -> a collective in progress
        self.pushes: dict = {}       # world rank of a shard -> [Push] not yet taken
        self.notices: dict = {}      # world rank of a shard -> [(arrival, counts)]
        self.windows: dict = {}      # (kind, group) -> per-rank state
        self.ports: dict = {}        # world rank of a worker -> its VirtualWorkerPort
        self.busy_until = [0.0] * world.size   # end of each rank's last compute (not in MPI)
        self.progressing: set = set()          # ranks whose communication thread keeps MPI going
        self.compute = None          # (world rank, its step, real seconds it took) -> simulated
                                     # compute seconds (the timeline's)


class InProcessTransport:
    """One virtual rank's transport over the ranks ``group`` (world ranks, in this group's rank
    order); ``wr`` is this rank's world rank."""

    name = "virtual"

    def __init__(self, cluster: Cluster, group: tuple, wr: int):
        self.c, self.group, self.wr = cluster, tuple(group), wr
        self.world = cluster.world
        self.rank, self.size = self.group.index(wr), len(self.group)
        self.steps = 0
        self.last_compute = 0.0
        self._real = 0.0                 # real seconds of this step before a straggler's sleep

    # identity and time ------------------------------------------------------
    def clock(self) -> float:
        return self.world.clock[self.world.me()]

    def step_done(self) -> None:
        """A step's compute: the timeline's seconds for it pass on this rank's clock."""
        real = self._real + time.perf_counter() - self.world.resumed[self.world.me()]
        self._real = 0.0
        self.last_compute = self.c.compute(self.wr, self.steps, real)
        self.steps += 1
        self.c.busy_until[self.wr] = self.clock() + self.last_compute
        self.advance(self.last_compute)

    def sleep(self, seconds: float) -> None:
        self._real += time.perf_counter() - self.world.resumed[self.world.me()]   # (the step so far)
        self.c.busy_until[self.wr] = self.clock() + seconds
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """The calling participant (this rank, or its communication thread) spends ``seconds``."""
        self.world.advance(self.world.me(), seconds)

    def target_ready(self, target_wr: int, t: float) -> float:
        """When a one-sided call issued at ``t`` to ``target_wr`` starts: at once, or (profile
        ``rma_progress = target``, across nodes) once the target has finished its compute."""
        net = self.c.net
        if self.c.profile.rma_progress != "target" or net.node(target_wr) == net.node(self.wr) or \
                target_wr in self.c.progressing:
            return t
        return max(t, self.c.busy_until[target_wr])

    def split(self, color: int, key: int) -> "InProcessTransport":
        def combine(vals):
            return vals
        everyone = self._collective((color, key, self.wr), combine, 0.0, "splitting the communicator")
        mine = sorted((k, wr) for c, k, wr in everyone if c == color)
        return InProcessTransport(self.c, tuple(wr for _, wr in mine), self.wr)

    def _wait(self, cond, doing: str) -> float:
        return self.world.block(self.world.me(), cond, doing)

    # collectives -----------------------------------------------------------
    def _collective(self, value, combine, seconds: float, doing: str):
        """Every rank of the group deposits ``value``; once all have, each gets ``combine(values in
        rank order)`` (computed once, while every other rank still waits in it), at the last arrival
        + ``seconds``.  Ranks entering different collectives (``doing``) is a bug MPI would hang on:
        raised."""
        c, key = self.c, self.group
        n = c.seq[(key, self.wr)] = c.seq.get((key, self.wr), 0) + 1
        slot = c.slots.setdefault((key, n), {"v": {}, "t": {}, "left": self.size, "kind": doing})
        if slot["kind"] != doing:
            raise RuntimeError(f"virtual rank {self.wr} entered collective {n} of its group "
                               f"{'in' if doing.startswith('in') else 'as'} '{doing}' while another "
                               f"rank is '{slot['kind']}': mismatched collectives")
        slot["v"][self.rank], slot["t"][self.rank] = value, self.clock()

        def ready():
            return max(slot["t"].values()) + seconds if len(slot["v"]) == self.size else None
        if self.size > 1:
            self._wait(ready, doing)
        if "r" not in slot:
            slot["r"] = combine([slot["v"][i] for i in range(self.size)])
        out = slot["r"]
        slot["left"] -= 1
        if not slot["left"]:
            del c.slots[(key, n)]
        return out

    def _small(self) -> float:
        """A small collective: a latency per doubling."""
        return self.c.net.lat * max(1, (self.size - 1).bit_length()) if self.size > 1 else 0.0

    def bcast(self, arr, root: int = 0) -> None:
        mine = np.array(arr, copy=True) if self.rank == root else None
        got = self._collective(mine, lambda v: v[root], self._small() + arr.nbytes / self.c.net.bps,
                               f"in a broadcast from rank {root}")
        if self.rank != root:
            arr[...] = got

    def bcast_text(self, text, root: int = 0) -> str:
        return self._collective(text if self.rank == root else None, lambda v: v[root] or "",
                                self._small(), "in a broadcast")

    def allgather_text(self, text: str) -> list[str]:
        return list(self._collective(text, list, self._small(), "in an all-gather"))

    def allgather_int64(self, a):
        vals = self._collective(np.asarray(a, dtype=np.int64).copy(), list, self._small(),
                                "in an all-gather")
        out = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        return out, np.repeat(np.arange(self.size), [v.size for v in vals])

    def allreduce_sum_host(self, a):
        return self._collective(np.array(a, copy=True), tree_sum, self._small(), "in a sum").copy()

    def allreduce_max_host(self, a):
        return self._collective(np.array(a, copy=True), lambda v: np.maximum.reduce(v),
                                self._small(), "in a maximum").copy()

    def iallreduce_max_host(self, a, poll=None):
        if poll is not None:
            poll()
        return self.allreduce_max_host(a)

    def allreduce_mean(self, arr) -> None:
        total = self._collective(np.array(arr, copy=True), tree_sum,
                                 self.c.net.collective_seconds(arr.nbytes, self.group),
                                 "in an average")
        arr[...] = total
        arr /= self.size

    def barrier(self) -> None:
        self._collective(None, lambda v: None, self._small(), "in a barrier")

    def funnel(self, arrays: dict, text: str, sink, root: int = 0) -> None:
        """Root's ``sink`` sees every rank's arrays in rank order, by reference (no copies: the
        ranks are all inside this collective while it runs, so p replicas never exist twice)."""
        nbytes = sum(v.nbytes for v in arrays.values())

        def combine(vals):
            for r, (arrs, txt, _) in enumerate(vals):
                vals[root][2](r, arrs, txt)
        self._collective((arrays, text, sink), combine, nbytes * self.size / self.c.net.bps,
                         "in the checkpoint funnel")

    # endpoints and windows --------------------------------------------------
    def worker_port(self, servers, bounds=None):
        return VirtualWorkerPort(self, [self.group[s] for s in servers], bounds)

    def server_port(self):
        return VirtualServerPort(self)

    def published_vector(self, n: int, dtype):
        return VirtualPublishedVector(self, n, dtype)

    def inbox(self, n: int, dtype):
        return VirtualInbox(self, n, dtype)

    def sample_counter(self, root: int = 0):
        return VirtualSampleCounter(self, root)

    def courier(self):
        """Overlapped gossip's communication thread: a helper participant of the world."""
        self.c.progressing.add(self.wr)
        return VirtualCourier(self)

    @staticmethod
    def thread_level() -> str:
        return "multiple"

    def allreducer(self, grads, layout, dist):
        return VirtualAllreducer(self, grads, dist)


class VirtualCourier:
    """``comm.window.Courier`` for a virtual rank: one job at a time, run by a helper participant
    with its own clock (from the time it was submitted), so the job's communication overlaps the
    rank's next compute in simulated time; ``wait`` blocks the rank until the job's end.  While
    idle it counts as progressing MPI (``Cluster.progressing``: no one-sided call to this rank
    waits for its compute)."""

    def __init__(self, net: InProcessTransport):
        self.net, self.world = net, net.world
        self.busy_seconds = self.exposed_seconds = 0.0
        self.jobs = 0
        self._state, self._job, self._result, self._closed = "idle", None, (None, None), False
        self._submitted = self._finished = 0.0
        self.id = self.world.add(self._run, f"vcourier-{net.wr}")

    @property
    def busy(self) -> bool:
        return self._state != "idle"

    @property
    def done(self) -> bool:
        return self._state in ("done", "idle")

    def submit(self, fn, *args) -> None:
        assert self._state == "idle" and not self._closed, "one job at a time, on an open courier"
        self._state, self._job, self._submitted = "queued", (fn, args), self.net.clock()

    def wait(self):
        t = self.net.clock()
        self.net._wait(lambda: None if self._state in ("queued", "running") else self._finished,
                       "waiting for the communication thread")
        if self._state == "idle":
            return None
        (value, error), self._result, self._state = self._result, (None, None), "idle"
        self.exposed_seconds += self.net.clock() - t
        if error is not None:
            raise error
        return value

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


class VirtualAllreducer:
    """The gradient sum of the ``allreduce`` method: the whole flat buffer in MPICH's order, at the
    ring all-reduce time once every rank finished backward; with ``dist.overlap`` the part of it
    that fits under backward (two thirds of the step's compute) is hidden."""

    overlap = False                    # nothing to do during backward: no hook
    transport = "virtual"

    def __init__(self, net: InProcessTransport, flat, dist):
        self.net, self.flat, self.dist = net, flat, dist

    def ready(self, names) -> None:
        pass

    def finish(self) -> None:
        n = self.net
        seconds = n.c.net.collective_seconds(self.flat.nbytes, n.group)
        if self.dist.overlap:
            backward = 2 / 3 * n.last_compute
            seconds = max(seconds - backward, seconds / 8)
        total = n._collective(self.flat, tree_sum, seconds, "in the gradient all-reduce")
        self.flat[...] = total


# ----------------------------------------------------------------------------- parameter server
class Push:
    """One worker's push to one shard: the header (copied), the payload slice (the worker's own
    buffer until the shard received it, as an MPI send buffer) and its times."""

    def __init__(self, src: int, hdr, part, arrival: float):
        self.src, self.hdr, self.part, self.arrival = src, hdr.copy(), part, arrival
        self.taken = self.received = None            # times


class VirtualWorkerPort:
    def __init__(self, net: InProcessTransport, servers: list, bounds):
        self.net, self.servers, self.bounds = net, servers, bounds
        net.c.ports[net.wr] = self
        self.replies = np.zeros((len(servers), ReplyHeader.SIZE), dtype=np.int64)
        self.reply = self.replies[0]
        self.reply_to = None          # this worker's reply buffer, while a reply is pending
        self.header_at = [None] * len(servers)
        self.payload_at = [None] * len(servers)
        self.sent: list[Push] = []

    def parts(self, a):
        if self.bounds is None:
            return [a]
        return [a[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]

    def post_reply(self, payload) -> None:
        assert self.reply_to is None, "a reply is already pending"
        self.reply_to = self.parts(payload)
        self.header_at = [None] * len(self.servers)
        self.payload_at = [None] * len(self.servers)

    def send_push(self, hdr, payload) -> None:
        n, net = self.net, self.net.c.net
        t = n.clock()
        self.sent = []
        for srv, part in zip(self.servers, self.parts(payload)):
            p = Push(n.wr, hdr, part, net.send(n.wr, srv, hdr.nbytes, t))
            n.c.pushes.setdefault(srv, []).append(p)
            self.sent.append(p)

        def taken():                   # Ssend: until every shard has taken the header
            ts = [p.taken for p in self.sent]
            return None if None in ts else max(ts)
        n._wait(taken, "pushing to the server (queued behind other workers)")

    def finish_push(self) -> None:
        def received():
            ts = [p.received for p in self.sent]
            return None if None in ts else max(ts)
        self.net._wait(received, "sending the push's payload")
        self.sent = []

    def wait_reply_header(self) -> None:
        self.net._wait(lambda: None if None in self.header_at else max(self.header_at),
                       "waiting for the server's reply")

    def wait_reply(self):
        self.net._wait(lambda: None if None in self.payload_at else max(self.payload_at),
                       "receiving the server's reply")
        self.reply_to = None
        return self.reply

    @property
    def pending(self) -> bool:
        return self.reply_to is not None


class VirtualServerPort:
    """A shard's end.  ``next_message`` picks the push or notice that arrived first (``model``) or
    the push the real run's shard served next (``replay``)."""

    def __init__(self, net: InProcessTransport):
        self.net = net
        self.push_hdr = header(PushHeader.SIZE)
        self.reply = header(ReplyHeader.SIZE)
        self.current: Push | None = None
        self.served = 0

    def _queue(self):
        return self.net.c.pushes.setdefault(self.net.wr, [])

    def _next_push(self):
        """The push to take next, or None if it has not been sent yet."""
        q = self._queue()
        replay = self.net.c.replay
        if replay is not None:
            want = replay.next_serve(self.net.wr, self.served)     # None: past the trace's end
            if want is not None:
                return next((p for p in q if p.src == want), None)
        return min(q, key=lambda p: (p.arrival, p.src)) if q else None

    def next_message(self) -> int:
        notices = self.net.c.notices.setdefault(self.net.wr, [])

        def ready():
            p = self._next_push()
            times = ([p.arrival] if p is not None else []) + [a for a, _ in notices[:1]]
            return min(times) if times else None
        self.net._wait(ready, "serving: waiting for a push")
        p = self._next_push()
        if notices and (p is None or notices[0][0] <= p.arrival):
            return Tag.PHASE_NOTICE
        return Tag.PUSH_HEADER

    def recv_push_header(self) -> int:
        self.net._wait(lambda: None if self._next_push() is None else self._next_push().arrival,
                       "serving: waiting for a push")
        p = self._next_push()
        self._queue().remove(p)
        self.push_hdr[...] = p.hdr
        p.taken = self.net.clock() + self.net.c.net.lat
        self.current = p
        return self.net.group.index(p.src)

    def recv_push_payload(self, src: int, payload) -> None:
        p, n = self.current, self.net
        if p.part.size != payload.size:
            raise RuntimeError(f"parameter server: rank {src} pushed {p.part.nbytes} bytes, expected "
                               f"{payload.nbytes} (do all ranks build the same model?)")
        arrival = n.c.net.send(p.src, n.wr, p.part.nbytes, p.taken)
        n._wait(lambda: arrival, "serving: receiving a push's payload")
        payload[...] = p.part
        p.received = n.clock()
        self.served += 1
        n.advance(n.c.net.apply_seconds(payload.nbytes))   # the update's arithmetic

    def send_reply(self, dest: int, payload) -> None:
        n = self.net
        port = n.c.ports[n.group[dest]]
        s = port.servers.index(n.wr)
        t = n.clock()
        port.replies[s] = self.reply
        port.header_at[s] = n.c.net.send(n.wr, n.group[dest], self.reply.nbytes, t)
        port.reply_to[s][...] = payload
        arrival = n.c.net.send(n.wr, n.group[dest], payload.nbytes, t)
        port.payload_at[s] = arrival
        n.advance(max(0.0, arrival - n.c.net.lat - t))    # until it left the NIC

    def send_notice(self, dest: int, counts) -> None:
        n = self.net
        wr = n.group[dest]
        n.c.notices.setdefault(wr, []).append((n.c.net.send(n.wr, wr, counts.nbytes, n.clock()),
                                               counts.copy()))

    def recv_notice(self, counts) -> None:
        notices = self.net.c.notices.setdefault(self.net.wr, [])
        self.net._wait(lambda: notices[0][0] if notices else None, "waiting for a phase notice")
        counts[...] = notices.pop(0)[1]

    def push_waiting(self):
        q, now = self._queue(), self.net.clock()
        early = [p for p in q if p.arrival <= now]
        return None if not early else self.net.group.index(min(early, key=lambda p: p.arrival).src)


# ----------------------------------------------------------------------------- gossip windows
class VirtualPublishedVector:
    """Every rank's latest publication (a copy) and its version; a read copies the target's."""

    def __init__(self, net: InProcessTransport, n: int, dtype):
        self.net, self.n, self.dtype = net, int(n), np.dtype(dtype)
        self.shared = net.c.windows.setdefault(("pub", net.group), {})
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
    """Push-sum inboxes: messages (copies) with their arrival times; a drain sums those that have
    arrived, in arrival order, from zeros (as Accumulate into a zeroed window would)."""

    def __init__(self, net: InProcessTransport, n: int, dtype):
        self.net, self.n, self.dtype = net, int(n), np.dtype(dtype)
        self.shared = net.c.windows.setdefault(("inbox", net.group), {})
        self.shared[net.rank] = []
        self.waited = 0.0
        self.drains = 0

    def push(self, target: int, msg, poll=None) -> None:
        n = self.net
        arrival = n.c.net.send(n.wr, n.group[target], msg.nbytes,
                               n.target_ready(n.group[target], n.clock()))
        self.shared[target].append((arrival, n.rank, msg.copy()))
        n._wait(lambda: arrival, f"pushing to rank {target}")

    def flush(self) -> None:
        pass

    def drain(self, out) -> None:
        n = self.net
        box = self.shared[n.rank]
        want = n.c.replay.next_drain(n.wr, self.drains) if n.c.replay is not None else None
        self.drains += 1
        if want is not None:           # replay: exactly the messages the run's drain folded
            def arrived():
                times = []
                for s, c in want.items():
                    got = [m[0] for m in box if m[1] == s][:c]
                    if len(got) < c:
                        return None
                    times += got
                return max(times, default=0.0)
            n._wait(arrived, f"draining the inbox (replay: {want})")
            here, left = [], dict(want)
            for m in box:              # each sender's oldest messages (MPI keeps one origin's order)
                if left.get(m[1], 0) > 0:
                    here.append(m)
                    left[m[1]] -= 1
            box[:] = [m for m in box if not any(m is h for h in here)]
            here.sort(key=lambda m: (m[0], m[1]))
        else:
            now = n.clock()
            here = sorted((m for m in box if m[0] <= now), key=lambda m: (m[0], m[1]))
            box[:] = [m for m in box if m[0] > now]
        out[...] = 0
        for _, _, msg in here:
            out += msg
        n.advance(n.c.net.apply_seconds(out.nbytes))      # the fold

    def free(self) -> None:
        pass

    win = VirtualPublishedVector.win
    flush_all = VirtualPublishedVector.flush_all


class VirtualSampleCounter:
    """The global sample count and the signals, on ``root``; an update is a round trip to it."""

    def __init__(self, net: InProcessTransport, root: int = 0):
        self.net, self.root = net, root
        self.shared = net.c.windows.setdefault(("counter", net.group),
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
