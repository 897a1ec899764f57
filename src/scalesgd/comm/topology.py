"""Who is who, computed once: rank, size, local rank on the node, the communicators."""
from __future__ import annotations

import os
from dataclasses import dataclass


class TopologyError(RuntimeError):
    """The MPI world is not what the launcher promised (e.g. srun with the wrong --mpi plugin)."""


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int          # rank among the processes sharing this node's memory
    local_size: int
    comm: object             # MPI.COMM_WORLD
    node_comm: object        # COMM_WORLD split by shared-memory node

    @property
    def is_root(self) -> bool:
        return self.rank == 0


def init() -> Topology:
    """Initialises MPI (through the mpi4py import) and computes the topology."""
    from mpi4py import MPI  # noqa: PLC0415 - importing initialises MPI; done here, not at import time

    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    step_tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if world.Get_size() == 1 and "SLURM_PROCID" in os.environ and step_tasks > 1:
        raise TopologyError(
            f"srun started {step_tasks} tasks but each sees an MPI world of size 1: the PMI plugin does "
            "not match the MPI library (use srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI)")
    return Topology(world.Get_rank(), world.Get_size(), node.Get_rank(), node.Get_size(), world, node)
