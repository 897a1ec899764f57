"""``dist.hierarchy = "node"``: communication in two levels, inside a node and between nodes.

Node membership is MPI's (``MPI_Comm_split_type(COMM_TYPE_SHARED)``), never host names, and is
computed once per use by the transport (``MPITransport.node_groups``, the split every method and
``Topology.worker_nodes`` use).  The rank with the lowest rank of each node is its *leader*; the
leaders form their own communicator.

``TwoLevelAllreduce`` is the ``allreduce`` method's gradient sum under the hierarchy (Horovod's
hierarchical all-reduce, over MPI): per bucket, an ``Ireduce`` to the node's leader (shared
memory), an ``Iallreduce`` among the leaders (the only bytes that cross the network: one copy of
the bucket per node instead of one per rank), then an ``Ibcast`` from the leader back to its node.
A bucket moves through the three stages as its requests complete (``progress``), so with
``dist.overlap`` the sums still run under backward.  Every communicator sees its collectives in
bucket order on every rank, as MPI requires: the reduces on one node communicator, the leaders'
sums on theirs, and the broadcasts on a second node communicator, posted by a member once its
own reduce of that bucket has completed (its buffer is free) and by the leader once the leaders'
sum of that bucket has.  Host buffers only (the ``host`` transport; a device buffer is staged
through the host as that transport does).  The sum is the same as the flat all-reduce's up to
the order of the additions: every rank ends with the same bytes.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .buckets import BucketedAllreduce

STAGES = ("reduce", "leaders", "bcast")   # a bucket's stages, in order; then done


class NodeGroups:
    """This rank's node (``node``, and ``node_bcast``, a duplicate for the broadcasts) and, on a
    leader, the leaders' communicator (``leaders``; None elsewhere).  A run's come from the job's one
    node split (``NodeGroups.of(transport.node_groups())``: MPI's shared-memory node); the
    constructor (collective on ``comm``, tests only) groups the ranks by ``color`` instead, to
    stand for nodes on one machine."""

    def __init__(self, comm, color: int):
        self.node = comm.Split(color, comm.Get_rank())
        self.node_bcast = self.node.Dup()
        self.is_leader = self.node.Get_rank() == 0
        split = comm.Split(0 if self.is_leader else MPI.UNDEFINED, comm.Get_rank())
        self.leaders = split if self.is_leader else None
        self.local_size = self.node.Get_size()
        counts = np.array([1 if self.is_leader else 0, self.local_size], np.int64)
        total, most = counts[:1].copy(), counts[1:].copy()
        comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, most, op=MPI.MAX)
        self.num_nodes, self.max_local_size = int(total[0]), int(most[0])

    @classmethod
    def of(cls, split) -> "NodeGroups":
        """The communicators of ``split`` (a ``topology.NodeSplit``: the job's one node split), plus
        a duplicate of the node's for the broadcasts; ``free`` frees the split too."""
        self = cls.__new__(cls)
        self.split = split
        self.node, self.is_leader = split.node.comm, split.is_leader
        self.node_bcast = self.node.Dup()
        self.leaders = split.leaders.comm if split.is_leader else None
        self.local_size, self.num_nodes, self.max_local_size = (split.node.size, split.num_nodes,
                                                                split.max_local_size)
        return self

    def free(self) -> None:
        split = getattr(self, "split", None)
        if split is not None:                 # (the split's transports own node and leaders)
            self.node_bcast.Free()
            split.free()
            return
        for c in (self.node, self.node_bcast, self.leaders):
            if c is not None:
                c.Free()


class TwoLevelAllreduce(BucketedAllreduce):
    """The host transport's bucketed sum, in two levels (module doc); same interface."""

    transport = "host (two-level)"

    def __init__(self, comm, flat, layout, bucket_bytes: int, overlap: bool = True, groups=None,
                 owns: bool = False):
        self.owns = owns                   # frees the groups' communicators in close()
        self.groups = groups
        super().__init__(comm, flat, layout, bucket_bytes, overlap)

    def on_host(self) -> "TwoLevelAllreduce":
        """Already the host transport: a new reducer that takes over the node communicators."""
        new = TwoLevelAllreduce(self.comm, self.flat, self.layout, self.bucket_bytes, self.overlap,
                                self.groups)
        new.owns, self.owns = self.owns, False
        return new

    def close(self) -> None:
        if self.owns:
            self.groups.free()
            self.owns = False

    def _reset(self):
        super()._reset()
        self.at = {}                             # bucket in flight -> its stage (index into _stages)
        self.pos = {}                            # bucket -> its place in the start order
        self.pending = {}                        # bucket in flight -> its request of that stage
        self.done = 0

    def _post(self, i: int, stage: str):
        lo, hi, _ = self.buckets[i]
        g, b = self.groups, self.buf[lo:hi]
        if stage == "reduce":
            if g.is_leader:
                return g.node.Ireduce(MPI.IN_PLACE, b, op=MPI.SUM, root=0)
            return g.node.Ireduce(b, None, op=MPI.SUM, root=0)
        if stage == "leaders":
            return g.leaders.Iallreduce(MPI.IN_PLACE, b, op=MPI.SUM)
        return g.node_bcast.Ibcast(b, root=0)

    def _stages(self) -> tuple[str, ...]:
        return STAGES if self.groups.is_leader else ("reduce", "bcast")

    def _advance(self, wait: bool = False) -> None:
        """Moves each bucket in flight whose request completed to its next stage (``wait``: waits
        for them, earliest started first, until none is in flight).  A bucket posts a stage only
        after every bucket started before it has posted it, so each communicator sees the start
        order (the order backward finished the buckets: the same on every rank; not always the
        bucket index, e.g. where a downsample branch's tensors finish after the main branch's)."""
        stages = self._stages()
        moved = True
        while moved and self.pending:
            moved = False
            for i in sorted(self.pending, key=self.pos.get):
                k = self.at[i] + 1
                if k < len(stages) and any(self.at[j] < k for j in self.at if self.pos[j] < self.pos[i]):
                    continue                     # an earlier bucket posts stage k first
                if wait:
                    self.pending[i].Wait()
                elif not self.pending[i].Test():
                    continue
                if k == len(stages):
                    del self.pending[i], self.at[i]
                    self.done += 1
                else:
                    self.at[i], self.pending[i] = k, self._post(i, stages[k])
                moved = True

    def _begin(self, i: int) -> None:
        """Bucket ``i``'s first stage (the base class calls it in bucket order)."""
        self.pos[i] = len(self.pos)
        self.at[i], self.pending[i] = 0, self._post(i, "reduce")
        self.requests.append(i)                  # (started: counted by finish)

    def progress(self) -> None:
        self._launch_landed()
        self._advance()

    def finish(self) -> None:
        self._launch_landed(wait=True)
        if self.requests:
            while self.pending:
                self._advance(wait=True)
            assert self.done == len(self.buckets), "a bucket was never started"
        else:                                    # no overlap: bucket by bucket, blocking
            self._to_mpi(0, self.flat.size)
            g = self.groups
            for lo, hi, _ in self.buckets:
                b = self.buf[lo:hi]
                if g.is_leader:
                    g.node.Reduce(MPI.IN_PLACE, b, op=MPI.SUM, root=0)
                    g.leaders.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
                else:
                    g.node.Reduce(b, None, op=MPI.SUM, root=0)
                g.node_bcast.Bcast(b, root=0)
        self._from_mpi()
        self._reset()
