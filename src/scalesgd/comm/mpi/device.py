"""How gradient buffers reach other ranks: the all-reducers, one per transport, chosen once by name.

``create_allreducer(comm, grads, layout, dist)`` is the one entry (a collective, on every rank): it
resolves ``dist.allreduce_transport`` to a transport every rank can use, logs the choice once (rank 0,
device buffers only) and returns that transport's all-reducer.  Every all-reducer has the interface of
:class:`buckets.BucketedAllreduce`: ``start(i)`` starts bucket ``i``, ``ready(names)`` (from
backward) starts each bucket whose tensors are all final, ``finish()`` completes the sum in place.

- ``host`` (``buckets.BucketedAllreduce``): MPI on host memory, NumPy buffers directly, device
  buffers through a pinned host copy (each bucket copied down as it starts); overlaps backward;
- ``cuda_aware_mpi`` (``CudaAwareAllreduce``): MPI on the device buffer itself, after a stream sync;
  blocking all-reduces after backward (what its probe tests), so no overlap;
- ``nccl`` (``NcclAllreduce``): one NCCL all-reduce of the whole buffer on the current stream after
  backward; does not overlap.

``auto`` (the default) picks, for device (CuPy) buffers: ``nccl`` when CuPy has NCCL bindings on every
rank and no two ranks of a node use the same GPU (NCCL refuses that); else ``cuda_aware_mpi`` when
every rank's MPI library says it is CUDA-aware (``MPIX_Query_cuda_support``, looked up in the loaded
libmpi) AND a small device all-reduce gives the right sum; else ``host``.  Without the query answering
yes no device pointer is handed to MPI (a non-CUDA-aware MPI crashes: SIGSEGV) unless
``cuda_aware_mpi`` is asked for by name, and never when some rank's query answers no (then that name
is an error).  NumPy buffers always take ``host`` (the only transport that exists for them).  A
transport asked for by name that some rank cannot use is an error on every rank, never a silent
fallback, and ``dist.overlap`` that the chosen transport cannot honour (``nccl``) is said in a warning
line.  Every decision is a collective (a MIN over the ranks), so all ranks take the same path even
when their probes differ.

On a GPU (one H200, 2026-12-04) only the host transport summed CuPy buffers (2 ranks) and NCCL ran
on one rank; NCCL and CUDA-aware MPI across ranks have NOT run.  The selection, the agreement and
the staging logic are tested on CPU (tests/test_gpu_selection.py).
"""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ...choices import ALLREDUCE_TRANSPORTS
from ...errors import BackendError, MethodError
from .buckets import BucketedAllreduce, auto_bucket_bytes
from .collectives import bcast_text
from ..staging import DeviceTimer, sync_stream

log = logging.getLogger("scalesgd")


# ----------------------------------------------------------------------------- what a rank can do
@dataclass(frozen=True)
class Probes:
    """What this rank found: NCCL importable, MPI CUDA support (None = the query is unavailable),
    the CUDA device it uses (None: unknown)."""

    nccl: bool
    mpi_cuda_query: bool | None
    device: int | None = None

    @classmethod
    def of_this_rank(cls) -> "Probes":
        return cls(nccl_module() is not None, mpi_cuda_query(), current_device())


def current_device() -> int | None:
    """The CUDA device this rank's CuPy arrays live on, None without CuPy."""
    try:
        import cupy  # noqa: PLC0415 - GPU machines only
        return int(cupy.cuda.Device().id)
    except Exception:
        return None


def devices_shared(comm, device: int | None) -> bool:
    """Collective: True on every rank when two ranks of some node use the same device (node =
    ``Split_type(COMM_TYPE_SHARED)``; an unknown device counts as distinct)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ids = np.empty(node.Get_size(), np.int64)
    node.Allgather(np.array([-1 - node.Get_rank() if device is None else device], np.int64), ids)
    node.Free()
    return not every_rank(comm, len(set(ids.tolist())) == ids.size)


def mpi_cuda_query() -> bool | None:
    """MPIX_Query_cuda_support() of the loaded MPI library (MPICH >= 4, Open MPI), None if absent."""
    try:
        with open("/proc/self/maps") as fh:
            libs = {ln.split()[-1] for ln in fh if "libmpi" in ln.split()[-1]}
    except OSError:
        return None
    for path in sorted(libs):
        try:
            fn = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        return bool(fn())
    return None


def nccl_module():
    """``cupy.cuda.nccl`` when CuPy has working NCCL bindings, else None."""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 - GPU machines only
    except Exception:
        return None
    return nccl if getattr(nccl, "available", True) else None


def transfer_works(comm) -> bool:
    """Collective: a small all-reduce of a device array through MPI gives the right sum."""
    import cupy  # noqa: PLC0415
    a = cupy.arange(8, dtype=cupy.float32) + comm.Get_rank()
    sync_stream(a)
    try:
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        log.debug("CUDA-aware test transfer failed: %s", exc)
        return False
    p = comm.Get_size()
    want = np.arange(8, dtype=np.float32) * p + p * (p - 1) / 2
    return bool(np.allclose(a.get(), want))


def every_rank(comm, flag: bool) -> bool:
    """Collective: True when ``flag`` is true on every rank of ``comm`` (one MIN all-reduce)."""
    mine = np.array([int(bool(flag))], dtype=np.int32)
    out = np.empty_like(mine)
    comm.Allreduce(mine, out, op=MPI.MIN)
    return bool(out[0])


# ----------------------------------------------------------------------------- the choice
def resolve(comm, requested: str, on_device: bool, probes: Probes | None = None,
            transfer_ok=None) -> tuple[str, str]:
    """Collective: (transport, why), the same on every rank.  ``probes`` and ``transfer_ok()`` (the
    device test all-reduce, a collective) default to this machine's; tests inject them.  Raises
    MethodError on every rank when ``requested`` names a transport some rank cannot use."""
    if requested not in ALLREDUCE_TRANSPORTS:
        raise MethodError(f"dist.allreduce_transport: expected one of {', '.join(ALLREDUCE_TRANSPORTS)}, "
                          f"got {requested!r}")
    if not every_rank(comm, on_device):                    # NumPy buffers on some rank: host only
        if requested in ("auto", "host"):
            return "host", "host (NumPy) buffers: MPI uses them directly"
        raise MethodError(f"dist.allreduce_transport = {requested}: needs device (CuPy) gradient "
                          "buffers on every rank, and this run has NumPy ones (train.device = cpu, "
                          "or no GPU found); use auto or host")
    if requested == "host":
        return "host", "asked for by name (dist.allreduce_transport = host)"
    probes = probes if probes is not None else Probes.of_this_rank()
    nccl = every_rank(comm, probes.nccl)
    # (collective only where NCCL is in question: nccl and requested agree on every rank)
    shared = devices_shared(comm, probes.device) if nccl and requested in ("nccl", "auto") else False
    if requested == "nccl" or (requested == "auto" and nccl and not shared):
        if not nccl:
            raise MethodError("dist.allreduce_transport = nccl: CuPy has no NCCL bindings on at least "
                              "one rank; use auto, cuda_aware_mpi or host")
        if shared:
            raise MethodError("dist.allreduce_transport = nccl: two ranks of a node use the same GPU "
                              "(more ranks than GPUs), which NCCL refuses; one rank per GPU, or use "
                              "auto, cuda_aware_mpi or host")
        return "nccl", "CuPy NCCL bindings on every rank, one GPU per rank"
    return _cuda_aware_or_host(comm, requested, probes, transfer_ok)


def _cuda_aware_or_host(comm, requested, probes, transfer_ok) -> tuple[str, str]:
    """The CUDA-aware MPI test (auto: only when every MPI says yes; by name: unless some rank's
    MPI says no, since a device pointer handed to an MPI built without CUDA is a SIGSEGV, which no
    ``try`` catches; a library without the query is the user's call)."""
    says_yes = every_rank(comm, probes.mpi_cuda_query is True)
    says_no = not every_rank(comm, probes.mpi_cuda_query is not False)
    if requested == "auto" and not says_yes:
        return "host", "MPI not CUDA-aware on every rank (MPIX_Query_cuda_support unavailable or 0)"
    if says_no:
        raise MethodError("dist.allreduce_transport = cuda_aware_mpi: the MPI library of at least one "
                          "rank says it is not CUDA-aware (MPIX_Query_cuda_support() = 0), and a device "
                          "buffer handed to it would crash the process; use auto, nccl or host")
    transfer_ok = transfer_ok if transfer_ok is not None else (lambda: transfer_works(comm))
    if every_rank(comm, transfer_ok()):
        return "cuda_aware_mpi", ("MPI reports CUDA support" if says_yes else "asked for by name") + \
            " and a test device all-reduce succeeded on every rank"
    if requested == "cuda_aware_mpi":
        raise MethodError("dist.allreduce_transport = cuda_aware_mpi: a test all-reduce of a device "
                          "array through MPI failed on at least one rank (MPI not CUDA-aware?); use "
                          "auto, nccl or host")
    return "host", "MPI claims CUDA support but a test device all-reduce failed (falling back)"


# ----------------------------------------------------------------------------- the device all-reducers
class CudaAwareAllreduce(BucketedAllreduce):
    """MPI reads and writes the device buffer itself; the stream is synced first.  Blocking
    ``Allreduce`` per bucket in ``finish()``, never ``Iallreduce``: the transport uses exactly what
    ``transfer_works`` tested, and Open MPI supports device buffers in blocking collectives only (its
    non-blocking ones reduce on the host and can crash, which no fallback survives).  So it does not
    overlap backward; the factory says so when ``dist.overlap`` asks for it."""

    transport = "cuda_aware_mpi"
    can_overlap = False

    def _mpi_buffer(self):
        return self.flat

    def _to_mpi(self, lo: int, hi: int) -> None:
        sync_stream(self.flat)                 # backward's kernels must be done with [lo, hi)

    def _from_mpi(self) -> None:
        pass                                   # reduced in place on the device


class NcclAllreduce(BucketedAllreduce):
    """The whole flat CuPy buffer summed by one NCCL all-reduce on the current stream in
    ``finish()`` (so no overlap with backward); the NCCL communicator comes from a unique id that
    rank 0 broadcasts over MPI as raw bytes (``nccl_id_bytes``, not pickled).  ``finish()`` only
    enqueues the sum, so its time is measured on the device, between two CUDA events
    (``device_seconds``)."""

    transport = "nccl"
    can_overlap = False

    def __init__(self, comm, flat, layout, bucket_bytes: int, overlap: bool = True, nccl=None):
        super().__init__(comm, flat, layout, bucket_bytes, overlap)
        self.nccl = nccl or nccl_module()
        self.nccl_comm = None
        (uid, as_bytes), why = (b"", True), ""
        if comm.Get_rank() == 0:
            try:
                uid, as_bytes = nccl_id_bytes(self.nccl.get_unique_id())
            except Exception as exc:  # noqa: BLE001 - told to every rank below, then raised
                why = f"{type(exc).__name__}: {exc}"
        why = bcast_text(comm, why)             # rank 0's failure ends every rank, with its reason
        if why:
            raise BackendError(f"nccl: rank 0 could not create the communicator id ({why}); "
                               "use --allreduce-transport host")
        head = np.array([len(uid), int(as_bytes)], np.int64)       # the id's length and its type
        comm.Bcast(head, root=0)
        root = comm.Get_rank() == 0
        buf = np.frombuffer(uid, np.uint8).copy() if root else np.empty(int(head[0]), np.uint8)
        comm.Bcast(buf, root=0)
        uid = nccl_id_for(buf.tobytes(), bool(head[1]))
        self.nccl_comm = self.nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())
        self.timer = DeviceTimer(flat)

    def device_seconds(self, wait: bool = False) -> float:
        return self.timer.seconds(wait)

    def close(self) -> None:
        """Destroys the NCCL communicator (once)."""
        if self.nccl_comm is not None:
            self.nccl_comm.destroy()
            self.nccl_comm = None

    def _mpi_buffer(self):
        return self.flat

    def finish(self) -> None:
        import cupy  # noqa: PLC0415 - only reached with CuPy arrays
        n, a = self.nccl, self.flat
        dtype = {"float32": n.NCCL_FLOAT32, "float64": n.NCCL_FLOAT64}[str(a.dtype)]
        began = self.timer.start()
        self.nccl_comm.allReduce(a.data.ptr, a.data.ptr, a.size, dtype, n.NCCL_SUM,
                                 cupy.cuda.get_current_stream().ptr)
        self.timer.stop(began)


def nccl_id_bytes(uid) -> tuple[bytes, bool]:
    """(NCCL's unique id as its raw bytes, whether this CuPy passes ids as ``bytes``): CuPy >= 14
    returns and takes ``bytes`` (its constructor refuses anything else with TypeError; upgrade guide,
    "Change in get_unique_id Return Type"); CuPy 13 used a tuple of C ``char`` values (-128..127)."""
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid), True
    return np.array([int(v) for v in uid], np.int64).astype(np.int8).tobytes(), False


def nccl_id_for(raw: bytes, as_bytes: bool):
    """The id in the form ``NcclCommunicator`` takes: the bytes themselves (CuPy >= 14), or CuPy
    13's tuple of signed chars."""
    return raw if as_bytes else tuple(int(v) for v in np.frombuffer(raw, np.int8))


ALLREDUCERS = {"host": BucketedAllreduce, "cuda_aware_mpi": CudaAwareAllreduce, "nccl": NcclAllreduce}


def bucket_bytes_of(dist, grads, ranks: int) -> int:
    """``dist.bucket_mb`` in bytes: -1 (the default) derives it from the gradient bytes and the rank
    count (``buckets.auto_bucket_bytes``); 0 is one bucket."""
    if dist.bucket_mb < 0:
        return auto_bucket_bytes(grads.size * grads.dtype.itemsize, ranks)
    return int(dist.bucket_mb * 1e6)


def make_allreducer(name: str, comm, flat, layout, bucket_bytes: int, overlap: bool):
    """The all-reducer of transport ``name`` (resolved: not ``auto``) over ``comm``."""
    return ALLREDUCERS[name](comm, flat, layout, bucket_bytes, overlap)


def create_allreducer(comm, grads, layout, dist, probes: Probes | None = None, transfer_ok=None,
                      groups=None):
    """Collective: the gradient all-reducer ``dist`` asks for (``allreduce_transport``,
    ``bucket_mb``, ``overlap``), the same transport on every rank, the choice logged once.  One
    rank: ``host`` (nothing is ever reduced, nothing is probed).  ``groups``: the node groups of
    ``dist.hierarchy = node`` (``hierarchy.NodeGroups``; the reducer owns and frees them)."""
    on_device = not isinstance(grads, np.ndarray)
    if comm.Get_size() == 1:
        name, why = "host", "one rank"
    elif getattr(dist, "hierarchy", "none") == "node":       # (config refuses a device transport)
        from .hierarchy import TwoLevelAllreduce  # noqa: PLC0415
        if groups is None:
            raise MethodError("dist.hierarchy = node: the all-reducer needs the job's node groups "
                              "(MPITransport.allreducer passes them)")
        red = TwoLevelAllreduce(comm, grads, layout, bucket_bytes_of(dist, grads, comm.Get_size()),
                                dist.overlap, groups, owns=True)
        if comm.Get_rank() == 0:
            log.info("allreduce: two-level (dist.hierarchy = node): %d node(s) of up to %d rank(s)",
                     red.groups.num_nodes, red.groups.max_local_size)
        return red
    else:
        name, why = resolve(comm, dist.allreduce_transport, on_device, probes, transfer_ok)
    red = make_allreducer(name, comm, grads, layout, bucket_bytes_of(dist, grads, comm.Get_size()),
                          dist.overlap)
    if comm.Get_rank() == 0 and comm.Get_size() > 1:
        log_choice(name, why, on_device, dist.overlap, red)
    return red


def log_choice(name: str, why: str, on_device: bool, overlap: bool, red) -> None:
    """Rank 0's lines: the transport (device buffers only, as NumPy runs have always been quiet),
    and a warning when ``dist.overlap`` asks for what the transport cannot do."""
    if on_device:
        log.info("allreduce transport: %s (%s)", name, why)
    if overlap and not red.overlap:
        log.warning("warning: dist.overlap is not honoured by the %s transport: the gradients are "
                    "summed after backward, not during it (--no-overlap silences this; "
                    "--allreduce-transport host overlaps)", name)
