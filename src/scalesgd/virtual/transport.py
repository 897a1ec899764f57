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
n nodes) once the last rank has arrived; a broadcast one transfer of its bytes, at the intra-node
rate within a node (a node's leader handing its parameters on), else the link's.  A one-sided
read is a round trip; an accumulate and the counter update wait for their completion at the
target (as the flushed MPI calls do).  The
gradient all-reduce (``allreduce.py``: flat, or in two levels with ``dist.hierarchy = node``)
hides under backward or not by the profile's ``allreduce_progress``; one-sided calls wait for a
busy target by its ``rma_progress`` (docs/virtual.md).  Node groups (``node_groups``,
``nodes.py``) are the profile's nodes, as MPI's shared-memory split makes them in a real job.

With a tape (``Cluster.tapes``, ``virtual/timetape.py``) every action that moves a rank's clock is
recorded with its cost's kind and bytes (``cost_seconds``), and the clock's reads are stamps, so
``virtual/retime.py`` can replay the clock under another profile.
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import RankFailed
from ..errors import LostRankError
from .allreduce import (GRADIENT_KINDS, VirtualAllreducer, VirtualTwoLevelAllreducer, gradient_seconds,
                        tree_sum)
from .cluster import Cluster
from .nodes import node_groups
from .ports import VirtualServerPort, VirtualWorkerPort
from .windows import VirtualCourier, VirtualInbox, VirtualPublishedVector, VirtualSampleCounter


class RankDied(BaseException):
    """Ends the participant of a virtual rank that died (``InProcessTransport.die``); a
    BaseException, so that no error handler of the run takes it for an error of its own."""


class VirtualDetector:
    """``comm/failures.Detector`` for a virtual rank: ``check`` raises once a rank of the job died."""

    def __init__(self, net: "InProcessTransport"):
        self.net = net

    def check(self) -> None:
        self.net._raise_if_lost()

    def is_failure(self, exc: BaseException) -> bool:
        return isinstance(exc, RankFailed)

    def free(self) -> None:
        """Nothing to free."""


class InProcessTransport:
    """One virtual rank's transport over the ranks ``group`` (world ranks, in this group's rank
    order); ``wr`` is this rank's world rank."""

    name = "virtual"

    def __init__(self, cluster: Cluster, group: tuple, wr: int):
        self.c, self.group, self.wr = cluster, tuple(group), wr
        self.world = cluster.world
        self.rank, self.size = self.group.index(wr), len(self.group)
        self.born = len(cluster.dead)    # the deaths before it: one more revokes it (``_lost``)
        self.key = (self.born, self.group)   # what its collectives, ports and windows are keyed by
        self.steps = 0
        self._real = 0.0                 # real seconds of this step before a straggler's sleep
        self.tape = cluster.tapes[wr] if cluster.tapes is not None else None
        self.successor = None            # the survivors' transport, once a rank died (``shrunk``)
        self.after_failure = False       # made by ``shrunk``

    # identity and time ------------------------------------------------------
    def clock(self) -> float:
        """The calling participant's clock; on a taped rank, a stamp (``virtual/timetape.py``)."""
        me = self.world.me()
        t = self.world.clock[me]
        return self.tape.read(t) if self.tape is not None and me == self.wr else t

    def _now(self) -> float:
        return self.world.clock[self.world.me()]

    @property
    def last_compute(self) -> float:
        return self.c.last_compute[self.wr]

    def step_done(self) -> None:
        """A step's compute: the timeline's seconds for it pass on this rank's clock."""
        real = self._real + time.perf_counter() - self.world.resumed[self.world.me()]
        self._real = 0.0
        if self.tape is not None:
            self.tape.op("c", real)
        self.compute(real)

    def compute(self, real: float) -> None:
        """This rank's next step's compute passes (its real seconds: ``real``)."""
        seconds = self.c.last_compute[self.wr] = self.c.compute(self.wr, self.steps, real)
        self.steps += 1
        self.c.busy_until[self.wr] = self._now() + seconds
        self.advance(seconds)

    def sleep(self, seconds: float) -> None:
        self._real += time.perf_counter() - self.world.resumed[self.world.me()]   # (the step so far)
        if self.tape is not None:
            self.tape.op("s", seconds)
        self.pause(seconds)

    def pause(self, seconds: float) -> None:
        """This rank sleeps ``seconds`` (not inside MPI)."""
        self.c.busy_until[self.wr] = self._now() + seconds
        self.advance(seconds)

    def untimed(self, what: str) -> None:
        """Notes on the tape an action whose timing depends on the order of events (the re-timing
        refuses such runs)."""
        if self.tape is not None:
            self.tape.op("x", what)

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

    def node_split(self, alone: bool = False) -> "InProcessTransport":
        """Collective: the sub-transport of this rank's node group (``nodes.py``: the profile's
        nodes; ``alone``: a group of its own)."""
        return self.node_groups(alone).node

    def node_groups(self, alone: bool = False):
        """Collective: this rank's ``comm/topology.py: NodeSplit`` (``nodes.node_groups``)."""
        return node_groups(self, alone)

    def split(self, color: int, key: int) -> "InProcessTransport":
        def combine(vals):
            return vals
        everyone = self._collective((color, key, self.wr), combine, ("none", 0), "splitting the communicator")
        mine = sorted((k, wr) for c, k, wr in everyone if c == color)
        return InProcessTransport(self.c, tuple(wr for _, wr in mine), self.wr)

    def free(self) -> None:
        """Nothing to free in one process (MPITransport.free's counterpart)."""

    def hang(self) -> None:
        """Blocks this virtual rank for ever (``MPITransport.hang``): the scheduler reports the
        deadlock once no rank can move."""
        self._wait(lambda: None, "hung on purpose (a receive nobody answers)")

    def _wait(self, cond, doing: str) -> float:
        """Blocks until ``cond()`` gives a time; raises ``RankFailed`` once a rank of this group
        died (as every call on a revoked communicator fails under ULFM)."""
        me, dead = self.world.me(), self.c.dead
        if not self.c.mortal:        # (no rank can die: the scheduler evaluates ``cond`` as it is)
            return self.world.block(me, cond, doing)

        def or_lost():               # (the scheduler's thread calls it: the waiter's clock by index)
            return self.world.clock[me] if dead and self._lost() else cond()
        t = self.world.block(me, or_lost, doing)
        self._raise_if_lost()
        return t

    # lost ranks (train.on_failure = continue; the MPI side: comm/mpi/failures.py) ----
    def _lost(self) -> bool:
        """Whether a rank of the job died since this transport was made: every communicator of
        the job is then revoked (ULFM: the survivors revoke them all, so a rank waiting among
        ranks that are all alive, e.g. in its node's group, fails out too)."""
        return len(self.c.dead) > self.born

    def _raise_if_lost(self) -> None:
        if self._lost():
            raise RankFailed(f"virtual rank(s) {sorted(self.c.dead)} died")

    def die(self) -> None:
        """This virtual rank dies (``SCALESGD_INJECT_FAULT=RANK:STEP:kill``): the others' calls
        that wait on it fail from now on (its collectives' waiters are woken to fail), and this
        rank's participant ends (``RankDied``).  Without ``train.on_failure = continue`` the job
        ends, as a real job does when one of its processes is killed."""
        if not self.c.mortal:
            raise LostRankError(f"virtual rank {self.wr} died (SCALESGD_INJECT_FAULT); "
                                "--on-failure continue trains on without it")
        c, now = self.c, self._now()
        c.dead.add(self.wr)
        for slot in list(c.slots.values()):     # every collective of the job is revoked
            slot["failed"] = True
            for q, _ in slot.pop("parked", ()):
                self.world.wake(q, now)
        raise RankDied(self.wr)

    def failure_detector(self) -> "VirtualDetector":
        return VirtualDetector(self)

    def shrunk(self):
        """Collective among the survivors (``MPITransport.shrunk``): the survivors' ``Topology``
        (their order kept, renumbered), the ranks of this group that died, the seconds it took."""
        from ..comm.topology import Topology  # noqa: PLC0415
        t0 = self._now()
        alive = tuple(r for r in self.group if r not in self.c.dead)
        new = InProcessTransport(self.c, alive, self.wr)
        new.barrier()                                    # the survivors agree
        new.after_failure, self.successor = True, new
        rpn = self.c.net.rpn
        topo = Topology(new.rank, new.size, new.rank % rpn, min(new.size, rpn), None, None, new)
        dead = [i for i, r in enumerate(self.group) if r in self.c.dead]
        return topo, dead, self._now() - t0

    # collectives -----------------------------------------------------------
    def cost_seconds(self, kind: str, nbytes: int) -> float:
        """Seconds a collective of ``kind`` over ``nbytes`` takes after its last rank arrived."""
        net = self.c.net
        if kind == "small":
            return self._small()
        if kind == "bcast":
            return self._small() + net.bcast_seconds(nbytes, self.group)
        if kind == "avg":
            return net.collective_seconds(nbytes, self.group)
        if kind == "funnel":
            return net.wire_seconds(nbytes)
        if kind in GRADIENT_KINDS:
            return gradient_seconds(self, kind, nbytes)
        if kind == "none":
            return 0.0
        raise ValueError(f"unknown collective cost {kind!r}")

    def _collective(self, value, combine, cost: tuple[str, int], doing: str):
        """Every rank of the group deposits ``value``; once all have, each gets ``combine(values in
        rank order)`` (computed once, while every other rank still waits in it), at the last arrival
        + ``cost_seconds(*cost)``.  Ranks entering different collectives (``doing``) is a bug MPI
        would hang on: raised."""
        c, key = self.c, self.key
        seconds = self.cost_seconds(*cost)
        if self.tape is not None:
            self.tape.op("k", self.tape.group(self.group), cost[0], int(cost[1]), doing)
        n = c.seq[(key, self.wr)] = c.seq.get((key, self.wr), 0) + 1
        slot = c.slots.setdefault((key, n), {"v": {}, "left": self.size, "kind": doing})
        if slot["kind"] != doing:
            raise RuntimeError(f"virtual rank {self.wr} entered collective {n} of its group "
                               f"{'in' if doing.startswith('in') else 'as'} '{doing}' while another "
                               f"rank is '{slot['kind']}': mismatched collectives")
        self._raise_if_lost()
        now = self._now()
        slot["v"][self.rank] = value
        slot["last"] = max(slot.get("last", now), now)     # the last arrival (O(1) for the scheduler)
        if self.size > 1:                   # the last arrival wakes the others (World.park)
            me = self.world.me()
            if len(slot["v"]) < self.size:
                slot.setdefault("parked", []).append((me, seconds))
                self.world.park(me, doing)
                if slot.get("failed"):                  # woken by a member's death
                    self._raise_if_lost()
            else:
                for q, their in slot.pop("parked", ()):
                    self.world.wake(q, slot["last"] + their)
                self.world.wait_until(me, slot["last"] + seconds, doing)
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

    def broadcast(self, arr, root: int = 0) -> None:
        mine = np.array(arr, copy=True) if self.rank == root else None
        got = self._collective(mine, lambda v: v[root], ("bcast", arr.nbytes),
                               f"in a broadcast from rank {root}")
        if self.rank != root:
            arr[...] = got

    def bcast_text(self, text, root: int = 0) -> str:
        return self._collective(text if self.rank == root else None, lambda v: v[root] or "",
                                ("small", 0), "in a broadcast")

    def allgather_text(self, text: str) -> list[str]:
        return list(self._collective(text, list, ("small", 0), "in an all-gather"))

    def allgather_int64(self, a):
        vals = self._collective(np.asarray(a, dtype=np.int64).copy(), list, ("small", 0),
                                "in an all-gather")
        out = np.concatenate(vals) if vals else np.zeros(0, np.int64)
        return out, np.repeat(np.arange(self.size), [v.size for v in vals])

    def allreduce_sum_host(self, a):
        return self._collective(np.array(a, copy=True), tree_sum, ("small", 0), "in a sum").copy()

    def allreduce_max_host(self, a):
        return self._collective(np.array(a, copy=True), lambda v: np.maximum.reduce(v),
                                ("small", 0), "in a maximum").copy()

    def iallreduce_max_host(self, a, poll=None):
        if poll is not None:
            poll()
        return self.allreduce_max_host(a)

    def allreduce_mean(self, arr) -> None:
        total = self._collective(np.array(arr, copy=True), tree_sum, ("avg", arr.nbytes),
                                 "in an average")
        arr[...] = total
        arr /= self.size

    def barrier(self) -> None:
        self._collective(None, lambda v: None, ("small", 0), "in a barrier")

    def funnel(self, arrays: dict, text: str, sink, root: int = 0) -> None:
        """Root's ``sink`` sees every rank's arrays in rank order, by reference (no copies: the
        ranks are all inside this collective while it runs, so p replicas never exist twice)."""
        nbytes = sum(v.nbytes for v in arrays.values())

        def combine(vals):
            for r, (arrs, txt, _) in enumerate(vals):
                vals[root][2](r, arrs, txt)
        self._collective((arrays, text, sink), combine, ("funnel", nbytes * self.size),
                         "in the checkpoint funnel")

    # endpoints and windows --------------------------------------------------
    def worker_port(self, servers, bounds=None):
        self.untimed("a parameter-server port")
        return VirtualWorkerPort(self, [self.group[s] for s in servers], bounds)

    def server_port(self):
        self.untimed("a parameter-server port")
        return VirtualServerPort(self)

    def published_vector(self, n: int, dtype):
        self.untimed("a one-sided window")
        return VirtualPublishedVector(self, n, dtype)

    def inbox(self, n: int, dtype):
        self.untimed("a one-sided window")
        return VirtualInbox(self, n, dtype)

    def sample_counter(self, root: int = 0):
        self.untimed("a one-sided counter")
        return VirtualSampleCounter(self, root)

    def courier(self):
        """Overlapped gossip's communication thread: a helper participant of the world."""
        self.untimed("a communication thread")
        self.c.progressing.add(self.wr)
        return VirtualCourier(self)

    @property
    def spans_nodes(self) -> bool:
        return len({self.c.net.node(wr) for wr in self.group}) > 1

    def keep_progressing(self, plan):
        """A progress thread or the library's own progress (``comm/progress.py``): one-sided calls
        to this rank no longer wait for its compute (``target_ready``); the poll interval and the
        CPU cost are not modelled."""
        from ..comm.progress import NoProgress  # noqa: PLC0415
        if plan.mechanism not in ("thread", "mpi"):
            return NoProgress()
        self.untimed("a progress thread")
        self.c.progressing.add(self.wr)
        return VirtualProgress(self)

    @staticmethod
    def thread_level() -> str:
        return "multiple"

    def allreducer(self, grads, layout, dist):
        """The gradient all-reducer (``allreduce.py``): in two levels with ``dist.hierarchy = node``
        (on more than one rank, as ``MPITransport.allreducer``), else flat."""
        if getattr(dist, "hierarchy", "none") == "node" and self.size > 1:
            return VirtualTwoLevelAllreducer(self, grads, dist)
        return VirtualAllreducer(self, grads, dist)

    def reducer_like(self, red, flat, layout, bucket_bytes: int, host: bool = False):
        """A fresh all-reducer of ``red``'s class over ``flat`` (the virtual cluster's reducers are
        its host transport: ``host`` changes nothing; layout and buckets are the profile's)."""
        return type(red)(self, flat, red.dist)


class VirtualProgress:
    """A virtual rank's progress thread: it marks the rank as progressing until ``close()``."""

    def __init__(self, net: InProcessTransport):
        self.net, self.pokes, self.error = net, 0, None

    def close(self) -> None:
        self.net.c.progressing.discard(self.net.wr)
