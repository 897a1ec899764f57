"""The MPI side of ``scalesgd doctor`` (comm/ is the only mpi4py importer): start MPI without refusing
a broken launch, and measure what the methods rely on.

- ``start()``: ``start.init()`` with its launch checks turned into a report: a launch that makes
  every rank a singleton (or mixes two MPI libraries) gives ``Start.problem`` instead of an exception,
  and the world is still returned whenever MPI_Init could run, so the other checks go on.
- ``allreduce_seconds``: timed in-place SUM all-reduces of one float32 buffer, checked for the sum.
- ``RmaProbe`` / ``rma_latencies``: ``Get``, ``Accumulate`` and ``Fetch_and_op`` through
  ``window.Window`` (the access pattern gossip uses: ``Win.Allocate``, one ``Lock_all(MODE_NOCHECK)``,
  ``Flush``) against a target that is computing outside MPI (``busy``); a latency close to the
  target's compute time means the origin waited for the target to enter MPI.  The one such probe:
  ``scalesgd doctor``, ``benchmarks/rma_progress.py`` and the tests use it.

Everything travels as buffers; nothing here prints.  Importing this module does not import
``mpi4py.MPI`` (that would initialise MPI before ``library.check_library`` could refuse a launch
that MPI_Init cannot survive): MPI is taken from ``library.load_mpi()`` inside each function.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import TopologyError
from . import start as starting
from .library import load_mpi
from ..topology import Topology

RMA_OPS = ("Get", "Accumulate", "Fetch_and_op")


@dataclass(frozen=True)
class Start:
    """How MPI came up.  ``topo`` is None when MPI_Init was not called (a launch it cannot survive,
    or no MPI library); ``problem`` is the launch check's one-line message ('' when the launch is
    sound); ``quiet``: this process is one of a broken launch that the launcher did not number 0, so
    (as the training program does) it reports nothing and exits 1."""

    topo: Topology | None
    library: str                 # MPI_Get_library_version, '' when mpi4py loads no library
    problem: str = ""
    quiet: bool = False


def start() -> Start:
    """Initialises MPI as ``start.init`` does, reporting instead of refusing a broken launch."""
    try:
        mpi = load_mpi()
        library = mpi.Get_library_version()
    except Exception as exc:     # noqa: BLE001 - no MPI library: reported as the first check
        return Start(None, "", f"mpi4py cannot load an MPI library ({type(exc).__name__}: {exc})")
    try:
        return Start(starting.init(), library)
    except TopologyError as exc:
        problem, quiet = str(exc), False
    except SystemExit:           # library._refuse on a rank the launcher did not number 0
        problem, quiet = "a broken launch (reported by the process the launcher numbered 0)", True
    if not mpi.Is_initialized():  # refused before MPI_Init: initialising would abort or hang
        return Start(None, library, problem, quiet)
    return Start(starting.of_comm(mpi.COMM_WORLD), library, problem, quiet)


def node_ids(topo: Topology) -> np.ndarray:
    """Collective: (size,) int64, for every rank the world rank of its node's local rank 0, so ranks
    with equal ids share a node (the same shared-memory split the program uses)."""
    leader = np.array([topo.rank], dtype=np.int64)
    topo.node_comm.Bcast(leader, root=0)
    out = np.empty(topo.size, dtype=np.int64)
    topo.comm.Allgather(leader, out)
    return out


def leaders(topo: Topology):
    """Collective: a communicator of one rank per node (local rank 0), None on the other ranks."""
    MPI = load_mpi()
    color = 0 if topo.local_rank == 0 else MPI.UNDEFINED
    comm = topo.comm.Split(color, topo.rank)
    return None if comm == MPI.COMM_NULL else comm


def allreduce_seconds(comm, nbytes: int, repeats: int) -> tuple[list[float], bool]:
    """Collective on ``comm``: the time of each of ``repeats`` in-place float32 SUM all-reduces of
    ``nbytes`` (each the slowest rank's: a collective is done when its last rank is), and whether
    every element of the last one came out as 1 + 2 + ... + size."""
    MPI = load_mpi()
    p, rank = comm.Get_size(), comm.Get_rank()
    buf = np.empty(max(1, nbytes // 4), dtype=np.float32)          # (n,)
    times, took = [], np.zeros(1, dtype=np.float64)
    for _ in range(repeats):
        buf.fill(rank + 1)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        took[0] = time.perf_counter() - t0
        comm.Allreduce(MPI.IN_PLACE, took, op=MPI.MAX)
        times.append(float(took[0]))
    right = np.array([int(np.all(buf == p * (p + 1) / 2))], dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, right, op=MPI.MIN)
    return times, bool(right[0])


def busy(seconds: float, kind: str = "numpy") -> int:
    """Work outside MPI for ``seconds``, as a training step does: small GEMMs (NumPy releases the
    GIL in them) or, ``kind="python"``, a pure-Python loop that holds the GIL.  Returns iterations."""
    a = np.full((64, 64), 1.0 / 64, dtype=np.float32)
    b = np.empty_like(a)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        if kind == "numpy":
            np.dot(a, a, out=b)
        else:
            sum(i * i for i in range(2000))
        n += 1
    return n


class RmaProbe:
    """Collective to create on ``comm``: the three one-sided access patterns gossip relies on, each
    on its own ``window.Window`` (``Win.Allocate``, one ``Lock_all(MODE_NOCHECK)``, ``Flush`` per
    call): ``Get`` of ``nbytes`` from a published vector, ``Accumulate`` of ``nbytes`` into an
    inbox, ``Fetch_and_op`` on an int64 counter.  The one probe of whether an origin waits for a
    busy target, used by ``scalesgd doctor``, ``benchmarks/rma_progress.py`` and the tests."""

    def __init__(self, comm, nbytes: int = 64):
        from .window import Window      # imports mpi4py.MPI: only once MPI is up
        self.comm, self.rank = comm, comm.Get_rank()
        self.wins = {"Get": Window(comm, nbytes), "Accumulate": Window(comm, nbytes),
                     "Fetch_and_op": Window(comm, 8)}
        self.buf = np.ones(nbytes // 4, np.float32)
        self.one, self.old = np.ones(1, np.int64), np.zeros(1, np.int64)

    def op(self, name: str, target: int) -> float:
        """Seconds for one ``name`` (of ``RMA_OPS``) on ``target``'s window, completed (Flush)."""
        win, t0 = self.wins[name], time.perf_counter()
        if name == "Get":
            win.get(self.buf, target)
        elif name == "Accumulate":
            win.accumulate(self.buf, target)
        else:
            win.fetch_and_op(self.one, self.old, target)
        return time.perf_counter() - t0

    def round(self, name: str, origin: int, target: int, busy_s: float, compute=busy,
              head_start: float | None = None) -> float | None:
        """Collective: ``target`` runs ``compute(busy_s)`` (no MPI calls; nothing when ``busy_s`` is
        0) while ``origin``, after ``head_start`` (default a fifth of ``busy_s``: the target is
        surely computing by then), times one ``name`` on it.  Seconds on ``origin``, else None."""
        self.comm.Barrier()
        out = None
        if self.rank == target:
            if busy_s > 0:
                compute(busy_s)
        elif self.rank == origin:
            time.sleep(busy_s / 5 if head_start is None else head_start)
            out = self.op(name, target)
        self.comm.Barrier()
        return out

    def free(self) -> None:
        for w in self.wins.values():
            w.free()


def rma_latencies(comm, origin: int, target: int, busy_s: float, compute=busy) -> dict[str, float]:
    """Collective on ``comm``: for each op of ``RMA_OPS`` in its own round (``RmaProbe.round``),
    ``target`` computes for ``busy_s`` outside MPI while ``origin`` times one op on its window.
    Returns {op: seconds} on ``origin``, {} elsewhere."""
    probe = RmaProbe(comm)
    out = {op: probe.round(op, origin, target, busy_s, compute) for op in RMA_OPS}
    probe.free()
    return {op: t for op, t in out.items() if t is not None}


def bcast_int(topo: Topology, value: int, root: int = 0) -> int:
    """Collective: ``root``'s integer on every rank."""
    buf = np.array([value], dtype=np.int64)
    topo.comm.Bcast(buf, root=root)
    return int(buf[0])


def mpi4py_version() -> str:
    import mpi4py  # noqa: PLC0415 - already imported with MPI
    return mpi4py.__version__
