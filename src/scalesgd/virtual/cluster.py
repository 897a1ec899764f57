"""The virtual cluster's shared state and network: ``Cluster`` (what p virtual ranks share) and
``Net`` (link and NIC timing, described in :mod:`transport`'s module doc), and ``Endpoint``, what
a rank's ports and windows (``ports.py``, ``windows.py``) use of its ``transport.InProcessTransport``.
"""
from __future__ import annotations

from typing import Protocol

from ..netmodel import element_pass_seconds, ring_allreduce_seconds, transfer_seconds


class Endpoint(Protocol):
    """One virtual rank's end of the network, as its ports and windows see it
    (``transport.InProcessTransport`` is the one implementation)."""

    c: Cluster                  # the shared state
    group: tuple                # world ranks of this transport's group, in group rank order
    key: tuple                  # (deaths before it was made, group): what its state is keyed by
    wr: int                     # this rank's world rank
    rank: int                   # its rank in ``group``
    world: object               # the scheduler and clocks (``world.World``)

    def clock(self) -> float: ...
    def advance(self, seconds: float) -> None: ...
    def target_ready(self, target_wr: int, t: float) -> float: ...
    def _wait(self, cond, doing: str) -> float: ...
    def _raise_if_lost(self) -> None: ...


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
        self.scale = 1.0        # bytes on the wire per byte sent (a profile's stands_for: its model's)

    def node(self, r: int) -> int:
        return r // self.rpn

    def send(self, src: int, dst: int, nbytes: int, t: float) -> float:
        """Arrival time at ``dst`` of ``nbytes`` sent by ``src`` at ``t`` (NICs updated)."""
        a, b = self.node(src), self.node(dst)
        nbytes = nbytes * self.scale
        if a == b:
            return t + nbytes / self.intra_bps + self.lat * 0.1
        tx = nbytes / self.bps
        start = max(t, self.out_free[a])
        self.out_free[a] = start + tx
        into = max(start, self.in_free[b])
        self.in_free[b] = into + tx
        self.bytes_sent[a] += int(nbytes)
        return into + tx + self.lat

    def collective_seconds(self, nbytes: int, group) -> float:
        """Ring all-reduce of ``nbytes`` over the nodes of ``group`` (within a node: its rate)."""
        nodes = len({self.node(r) for r in group})
        nbytes = nbytes * self.scale
        if nodes == 1:                # (one node: its intra-node rate, the latency left out)
            return ring_allreduce_seconds(nbytes, len(group), self.intra_bps)
        return ring_allreduce_seconds(nbytes, nodes, self.bps, self.lat)

    def apply_seconds(self, nbytes: int) -> float:
        """Arithmetic over a flat buffer on the device (a server's update, a gossip mix): three
        passes at the profile's memory rate."""
        return element_pass_seconds(nbytes, self.p.mem_gbps * 1e9, self.scale)

    def bcast_seconds(self, nbytes: int, group) -> float:
        """A broadcast of ``nbytes`` (pipelined: about one transfer of it) over the links ``group``
        spans: within one node its intra-node rate (a node's leader handing its parameters to
        the node's ranks), across nodes the link's."""
        within = len({self.node(r) for r in group}) == 1
        return transfer_seconds(nbytes * self.scale, self.intra_bps if within else self.bps)

    def wire_seconds(self, nbytes: int) -> float:
        """Seconds of ``nbytes`` at the link rate (no NIC queueing: collectives' own terms)."""
        return transfer_seconds(nbytes * self.scale, self.bps)


class Cluster:
    """The shared state of p virtual ranks: the world (clocks, scheduler), the network, the
    collectives in progress, mailboxes and windows, and the replay's recorded order."""

    def __init__(self, world, profile, replay=None):
        self.world, self.profile, self.replay = world, profile, replay
        self.net = Net(profile, world.size)
        self.seq: dict = {}          # (group key, world rank) -> collectives entered
        self.slots: dict = {}        # (group key, seq) -> a collective in progress
        self.pushes: dict = {}       # (group key, world rank of a shard) -> [Push] not yet taken
        self.notices: dict = {}      # (group key, world rank of a shard) -> [(arrival, counts)]
        self.windows: dict = {}      # (kind, group key) -> per-rank state
        self.ports: dict = {}        # (group key, world rank of a worker) -> its VirtualWorkerPort
                                     # (a group's messages never reach another's, nor a
                                     # shrunk job's the old one's: the key holds the deaths)
        self.busy_until = [0.0] * world.size   # end of each rank's last compute (not in MPI)
        self.progressing: set = set()          # ranks whose communication thread keeps MPI going
        self.compute = None          # (world rank, its step, real seconds it took) -> simulated
                                     # compute seconds (the timeline's)
        self.last_compute = [0.0] * world.size  # each rank's last step's compute (simulated)
        self.tapes = None            # [virtual.timetape.Tape] per rank: recording for a re-timing
        self.dead: set = set()       # world ranks that died (``InProcessTransport.die``)
        self.mortal = False          # train.on_failure = continue: the others survive a death, so
                                     # every wait must notice one (off: no cost on the waits)
