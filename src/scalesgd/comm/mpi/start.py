"""Starting MPI: ``init`` checks the launch (``library``), initialises MPI and builds the world's
``Topology`` with its ``MPITransport``; ``of_comm`` builds it for any communicator (the survivors'
after a shrink).  Importing this module does not import ``mpi4py.MPI``: that would initialise MPI
before ``check_library`` could refuse a launch that MPI_Init cannot survive, so the transport (whose
collectives import it) is imported once MPI is up.
"""
from __future__ import annotations

from .library import check_library, check_world, load_mpi
from ..shm import release_node_segment
from ..topology import Topology


def init() -> Topology:
    """Initialises MPI (at mpi4py's default thread level) and computes the topology."""
    MPI = load_mpi()
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
    release_node_segment(topo.node_comm)
    return topo


def of_comm(comm) -> Topology:
    """Collective: the topology of the job on ``comm`` (the world, or the survivors' after a shrink)."""
    from .transport import topology_of  # noqa: PLC0415 - imports mpi4py.MPI: only once MPI is up
    return topology_of(comm)
