"""Node groups of the virtual cluster (``dist.hierarchy = node``): the split ``MPITransport.node_groups``
makes, with the profile's nodes for MPI's shared-memory ones.

A profile's ``ranks_per_node`` puts consecutive world ranks on one node (``cluster.Net.node``).  A
transport's ranks are grouped by node, in the transport's rank order; a rank that passes ``alone``
(a server) is a group of its own and in no other rank's group, so the workers on a server's node
form a group without it.  The groups are ordered by their leader (their lowest rank), the leaders'
transport holds the leaders in rank order, and each group's size is known to every rank: the
``comm/topology.py: NodeSplit`` the MPI transport returns, field for field.  ``methods/hierarchical.py``
(``methods.hierarchical``: gossip, local SGD, EASGD, A-SGD) uses it; the two-level all-reduce groups its ranks
with ``groups_of`` (``allreduce.py``), and ``virtual/run.py`` counts the worker groups
(``worker_nodes``) for ``config.fit_to_world`` (A-SGD's rate), as ``Topology.worker_nodes`` does.
"""
from __future__ import annotations


def groups_of(nodes: list, alone: list) -> list[tuple]:
    """The node groups of ranks 0..n-1, given each rank's node and whether it stands ``alone``:
    tuples of ranks in rank order, the groups in the order of their leaders (lowest ranks)."""
    by: dict = {}
    for r, (node, lone) in enumerate(zip(nodes, alone)):
        by.setdefault(("alone", r) if lone else ("node", node), []).append(r)
    return sorted((tuple(g) for g in by.values()), key=lambda g: g[0])


def worker_nodes(size: int, num_servers: int, ranks_per_node: int) -> int:
    """The worker node groups of a virtual job of ``size`` ranks whose first ``num_servers`` serve
    (each alone), ``ranks_per_node`` consecutive ranks a node."""
    rpn = max(1, int(ranks_per_node))
    return len(groups_of([r // rpn for r in range(size)], [r < num_servers for r in range(size)])) \
        - num_servers


def node_groups(net, alone: bool = False):
    """Collective on ``net`` (an ``InProcessTransport``): this rank's ``NodeSplit`` (module doc).
    The ranks share their ``alone`` in one small collective; the sub-transports are the group's
    and, on a leader, the leaders'."""
    from ..comm.topology import NodeSplit  # noqa: PLC0415
    lone = net._collective(bool(alone), list, ("small", 0), "in the split into node groups")
    groups = groups_of([net.c.net.node(wr) for wr in net.group], lone)
    mine = next(g for g in groups if net.rank in g)
    leaders = [g[0] for g in groups]
    make = type(net)
    node = make(net.c, tuple(net.group[r] for r in mine), net.wr)
    lead = make(net.c, tuple(net.group[r] for r in leaders), net.wr) if mine[0] == net.rank else None
    return NodeSplit(node, lead, mine[0], leaders.index(mine[0]), tuple(len(g) for g in groups))
