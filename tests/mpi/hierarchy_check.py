"""Rank script (4 ranks) for tests/test_hierarchy.py: the two-level all-reduce (comm/mpi/hierarchy.py)
against the flat sum, with the ranks grouped as 2 + 2 and as 3 + 1 "nodes", overlapped (buckets
started as backward would, in reverse layout order, with progress in between) and not, three
steps each on the same reducer.  Every rank's result must be the same bytes, and equal the sum of
every rank's gradients to rounding.  Prints one line per check from rank 0."""
import numpy as np
from mpi4py import MPI

from scalesgd.comm.mpi.hierarchy import NodeGroups, TwoLevelAllreduce
from scalesgd.nn.resnet import ResNet

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert size == 4, "run with 4 ranks"
layout = ResNet("resnet20", 10, seed=None).ps.layout
n = layout.size
for name, colors in (("2+2", [0, 0, 1, 1]), ("3+1", [0, 0, 0, 1])):
    groups = NodeGroups(comm, color=colors[rank])
    assert groups.num_nodes == 2 and groups.max_local_size == max(colors.count(c) for c in set(colors))
    for overlap in (True, False):
        flat = np.zeros(n, np.float64)
        red = TwoLevelAllreduce(comm, flat, layout, 64 * 1024, overlap, groups)
        assert len(red.buckets) > 3
        for step in range(3):
            rng = np.random.default_rng([step, rank])
            flat[:] = rng.standard_normal(n)
            everyone = np.empty((size, n))
            comm.Allgather(flat, everyone)
            if overlap:           # the same order on every rank, but buckets finish out of index
                order = np.random.default_rng(step).permutation(len(layout.specs))   # order
                for k in order:
                    red.ready([layout.specs[k].name])
            red.finish()
            got = np.empty((size, n))
            comm.Allgather(flat, got)
            assert all(np.array_equal(got[0], got[r]) for r in range(size)), "ranks differ"
            err = float(np.max(np.abs(got[0] - everyone.sum(axis=0))))
            assert err < 1e-12, err
        if rank == 0:
            print(f"two-level {name} overlap={overlap}: {len(red.buckets)} buckets x 3 steps, max "
                  f"error {err:.1e}: ok", flush=True)
    groups.free()
