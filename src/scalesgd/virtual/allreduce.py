"""The virtual cluster's gradient all-reducers (the ``allreduce`` method's sum), flat and in two levels.

``VirtualAllreducer``: the whole flat buffer summed over the transport's ranks in MPICH's
all-reduce order (``tree_sum``), once every rank finished backward.

``VirtualTwoLevelAllreducer`` (``dist.hierarchy = node``; the MPI job's is
``comm/mpi/hierarchy.py: TwoLevelAllreduce``: per bucket a reduce to the node's leader, an all-reduce
among the leaders, a broadcast to the node).  The sum, in a stated order: each node group's
buffers (``nodes.groups_of``: the profile's nodes, in rank order) by ``tree_sum``, then the groups'
sums, in leader order, by ``tree_sum`` again; every rank gets the same bytes.  The node's order is
MPICH's reduce for buckets above its short-message size (2 KiB: reduce-scatter and gather, the
all-reduce's pairing), measured with MPICH 5.0.2 on nodes of 3 to 7 ranks; below it MPICH's
binomial tree differs from it on nodes of 5 ranks (and some above 8), and Open MPI's is another.
Its time (``two_level_seconds``), after the last rank's backward: the node's reduce and, after the
leaders' sum, its broadcast, each (k - 1)/k bytes at the profile's ``intra_gbps`` (k: the node's
ranks; together one ring all-reduce inside the node), and between them the leaders' ring
all-reduce at the NIC's rate and latency (``Net.collective_seconds`` over one rank per node).  The
flat one costs the ring over the nodes involved (a node-aware all-reduce, as MPICH's is), so on
the clock the two levels add the two intra-node stages; what they change is which ranks' bytes
cross (one copy per node).  Both follow the profile's ``allreduce_progress`` (``gradient_seconds``).
"""
from __future__ import annotations

import logging

import numpy as np

from .nodes import groups_of

GRADIENT_KINDS = ("grad", "grad-overlap", "grad-nodes", "grad-nodes-overlap")   # cost kinds (tape)


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


def two_level_sum(arrays: list, groups: list) -> np.ndarray:
    """``arrays`` (in rank order) summed in two levels: each group of ``groups`` (tuples of
    indices, in leader order) by ``tree_sum``, then the groups' sums by ``tree_sum``.  A new array."""
    return tree_sum([tree_sum([arrays[i] for i in g]) for g in groups])


def node_layout(net, group) -> list:
    """The node groups of the world ranks ``group`` (as indices into it), by the profile's nodes."""
    return groups_of([net.node(wr) for wr in group], [False] * len(group))


def two_level_seconds(net, group, wr: int, nbytes: int) -> float:
    """The two-level all-reduce's seconds for world rank ``wr`` of ``group`` after its last rank
    arrived (module doc): the largest node's reduce, the leaders' ring, ``wr``'s node's broadcast."""
    groups = node_layout(net, group)

    def stage(k: int) -> float:
        return (k - 1) / k * nbytes * net.scale / net.intra_bps
    own = next(len(g) for g in groups if group.index(wr) in g)
    leaders = [group[g[0]] for g in groups]
    return max(stage(len(g)) for g in groups) + net.collective_seconds(nbytes, leaders) + stage(own)


def gradient_seconds(tr, kind: str, nbytes: int) -> float:
    """The gradient all-reduce of transport ``tr`` after the last rank's backward, by the profile's
    ``allreduce_progress``: ``async`` hides the part that fits under this rank's backward (two
    thirds of its step's compute) with overlap (``kind`` ends in ``-overlap``), down to an eighth;
    ``host`` moves only inside MPI: ``host_allreduce_factor`` times the formula (flat: the ring;
    ``grad-nodes``: the two levels), of which only the measured ``host_hidden_fraction`` hides
    under backward with overlap (the buckets' launches)."""
    prof, net = tr.c.profile, tr.c.net
    overlap = kind.endswith("-overlap")
    if kind.startswith("grad-nodes"):
        seconds = two_level_seconds(net, tr.group, tr.wr, nbytes) if tr.size > 1 else 0.0
    else:
        seconds = net.collective_seconds(nbytes, tr.group)
    if prof.allreduce_progress == "host":
        seconds *= prof.host_allreduce_factor
        return seconds * (1.0 - prof.host_hidden_fraction) if overlap else seconds
    if overlap:
        backward = 2 / 3 * tr.c.last_compute[tr.wr]
        seconds = max(seconds - backward, seconds / 8)
    return seconds


class VirtualAllreducer:
    """The gradient sum of the ``allreduce`` method: the whole flat buffer in MPICH's order, once
    every rank finished backward, at ``gradient_seconds``."""

    overlap = False                    # nothing to do during backward: no hook
    transport = "virtual"
    kind = "grad"                      # the cost kind (``gradient_seconds``)

    def __init__(self, net, flat, dist):
        self.net, self.flat, self.dist = net, flat, dist

    def ready(self, names) -> None:
        pass

    def close(self) -> None:
        """Nothing to free (the MPI transports' interface)."""

    def device_seconds(self, wait: bool = False) -> float:
        """Nothing runs on a device (the MPI transports' interface)."""
        return 0.0

    def progress(self) -> None:
        """Nothing in flight between ``ready`` and ``finish`` (the MPI transports' interface)."""

    def launch_all(self) -> None:
        """The sum starts in ``finish`` (the MPI transports' interface)."""

    def _sum(self, values: list) -> np.ndarray:
        return tree_sum(values)

    def finish(self) -> None:
        kind = self.kind + ("-overlap" if self.dist.overlap else "")
        total = self.net._collective(self.flat, self._sum, (kind, self.flat.nbytes),
                                     "in the gradient all-reduce")
        self.flat[...] = total


class VirtualTwoLevelAllreducer(VirtualAllreducer):
    """``dist.hierarchy = node``: the sum in two levels, each node's then the leaders' (module doc),
    at ``two_level_seconds``; rank 0 logs the node groups as the MPI job's reducer does."""

    transport = "virtual (two-level)"
    kind = "grad-nodes"

    def __init__(self, net, flat, dist):
        super().__init__(net, flat, dist)
        self.groups = node_layout(net.c.net, net.group)
        if net.rank == 0:
            logging.getLogger("scalesgd").info(
                "allreduce: two-level (dist.hierarchy = node): %d node(s) of up to %d rank(s)",
                len(self.groups), max(len(g) for g in self.groups))

    def _sum(self, values: list) -> np.ndarray:
        return two_level_sum(values, self.groups)
