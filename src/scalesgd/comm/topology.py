"""Who is who, computed once: rank, size, local rank on the node, the communicators and the
transport (``Topology``), and who does what for one method (``Roles``).  Plain records: no MPI here
(``start.init`` builds the MPI job's, ``virtual/run.py`` a virtual rank's).
"""
from __future__ import annotations

from dataclasses import dataclass

# re-exported where it was first raised: topology.TopologyError
from ..errors import TopologyError  # noqa: F401


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int          # rank among the processes sharing this node's memory
    local_size: int
    comm: object             # MPI.COMM_WORLD (None for a virtual rank)
    node_comm: object        # COMM_WORLD split by shared-memory node
    transport: object = None # what methods and the control plane talk through (comm/mpi/transport.py;
                             # None only in the record an error ends the job through)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def worker_nodes(self, num_servers: int) -> int:
        """Collective: the nodes holding ranks ``num_servers..size-1`` (the workers), which are the
        worker node groups of ``dist.hierarchy = node`` (``methods/hierarchical.py``: a server rank
        is a group of its own), through the transport's ``node_groups`` (MPI's shared-memory nodes,
        or a virtual rank's profile nodes: ``virtual/nodes.py``).  The world's size without a
        transport (the record an error ends the job through)."""
        if self.transport is None:
            return self.size
        split = self.transport.node_groups(alone=self.rank < num_servers)   # the groups node_group forms
        split.free()
        return split.num_nodes - num_servers

    def roles(self, num_servers: int) -> "Roles":
        """Collective when ``num_servers`` > 0 (splits off the workers' communicator)."""
        return Roles.of(self, num_servers)


@dataclass(frozen=True)
class NodeSplit:
    """This rank's node group (``dist.hierarchy = node``), the one split of a job's ranks into nodes
    that every method uses (``MPITransport.node_groups``): MPI's shared-memory node, in job rank
    order, a server rank (``alone``) a group of its own; the groups' leaders are their lowest ranks."""

    node: object             # the transport of this rank's group
    leaders: object          # the transport of the groups' leaders (leader order = job order);
                             # None on a member
    leader_rank: int         # the job rank of this group's leader
    group_index: int         # its leader's rank among the leaders
    sizes: tuple             # every group's size, in leader order

    @property
    def is_leader(self) -> bool:
        return self.node.rank == 0

    @property
    def num_nodes(self) -> int:
        return len(self.sizes)

    @property
    def max_local_size(self) -> int:
        return max(self.sizes)

    def free(self) -> None:
        """Collective: frees the group's and the leaders' communicators (their sizes stay readable)."""
        for sub in (self.leaders, self.node):
            if sub is not None:
                sub.free()


@dataclass(frozen=True)
class Roles:
    """Who does what for one method, computed once: ranks ``0..num_servers-1`` serve (the
    parameter-server methods), the rest are workers, numbered ``0..num_workers-1`` in rank order.

    ``workers`` is a transport of the workers only (``None`` on a server rank), for reductions
    that concern only the replicas (e.g. BN statistics); with no server it is the world's.
    ``servers`` is the servers' transport on a server rank (``None`` elsewhere)."""

    rank: int
    size: int
    num_servers: int
    workers: object
    servers: object = None

    @classmethod
    def of(cls, topo: Topology, num_servers: int) -> "Roles":
        if not num_servers:
            return cls(topo.rank, topo.size, 0, topo.transport)
        serving = topo.rank < num_servers
        split = topo.transport.split(0 if serving else 1, topo.rank)
        if serving:
            return cls(topo.rank, topo.size, num_servers, None, split)
        return cls(topo.rank, topo.size, num_servers, split)

    @property
    def is_server(self) -> bool:
        return self.rank < self.num_servers

    @property
    def server(self) -> int:
        """The (first) server's rank; -1 without one."""
        return 0 if self.num_servers else -1

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.num_servers))

    @property
    def shard(self) -> int:
        """0..num_servers-1 on a server (the slice of the flat buffer it holds); -1 elsewhere."""
        return self.rank if self.is_server else -1

    @property
    def num_workers(self) -> int:
        return self.size - self.num_servers

    @property
    def worker_index(self) -> int:
        """0..num_workers-1 on a worker; -1 on a server."""
        return -1 if self.is_server else self.rank - self.num_servers

    def worker_rank(self, w: int) -> int:
        """The rank of worker ``w``."""
        return w + self.num_servers

    def worker_of(self, rank: int) -> int:
        """The worker index of ``rank``."""
        return rank - self.num_servers
