"""How device (CuPy) buffers reach other ranks: NCCL, CUDA-aware MPI, or pinned host staging.

Decided once at start-up, agreed by every rank (the weakest wins), logged once:

- ``nccl``            gradient all-reduce through CuPy's NCCL bindings (``allreduce`` only); the
                      communicator comes from a unique id broadcast over MPI as bytes;
- ``cuda_aware_mpi``  MPI calls take device buffers directly: chosen when the MPI library says so
                      (``MPIX_Query_cuda_support``, looked up in the loaded libmpi) AND a small test
                      all-reduce of a device array gives the right sum.  Without the query answering
                      yes no device pointer is ever handed to MPI (a non-CUDA-aware MPI may crash);
                      ``SCALESGD_CUDA_AWARE_MPI=1`` forces the test transfer, ``=0`` forbids it;
- ``host_staging``    :class:`collectives.HostStage`'s pinned host copies (always works).

The CuPy stream is synchronised before any MPI call touches a device buffer (``sync_stream``).
NOT YET RUN ON A GPU; the selection logic is unit-tested on CPU with injected probes.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

log = logging.getLogger("scalesgd")
TRANSPORTS = ("nccl", "cuda_aware_mpi", "host_staging")
_RANK = {t: i for i, t in enumerate(TRANSPORTS)}    # lower = preferred


@dataclass(frozen=True)
class Probes:
    """What this rank found: device arrays in use, NCCL importable, MPI CUDA support (None = unknown)."""

    device: bool
    nccl: bool
    mpi_cuda_query: bool | None
    force_cuda_aware: bool | None = None     # SCALESGD_CUDA_AWARE_MPI: 1 -> True, 0 -> False


def choose(p: Probes, collective: str = "allreduce", transfer_ok=None) -> tuple[str, str]:
    """(transport, why) for one rank.  ``transfer_ok()`` runs the test transfer (only when allowed)."""
    if not p.device:
        return "host_staging", "host (NumPy) buffers: MPI uses them directly"
    if collective == "allreduce" and p.nccl:
        return "nccl", "CuPy NCCL bindings available"
    if p.force_cuda_aware is False:
        return "host_staging", "SCALESGD_CUDA_AWARE_MPI=0"
    if p.mpi_cuda_query or p.force_cuda_aware:
        if transfer_ok is None or transfer_ok():
            return "cuda_aware_mpi", "MPI reports CUDA support and a test transfer succeeded"
        return "host_staging", "MPI claims CUDA support but the test transfer failed (fallback)"
    return "host_staging", "MPI not CUDA-aware (MPIX_Query_cuda_support unavailable or 0)"


def agree(comm, transport: str) -> str:
    """The least capable choice over all ranks (every rank must use the same path)."""
    mine = np.array([_RANK[transport]], dtype=np.int32)
    worst = np.empty_like(mine)
    comm.Allreduce(mine, worst, op=MPI.MAX)
    return TRANSPORTS[int(worst[0])]


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


def env_force() -> bool | None:
    v = os.environ.get("SCALESGD_CUDA_AWARE_MPI", "")
    return None if v == "" else v not in ("0", "false", "no")


def nccl_module():
    """``cupy.cuda.nccl`` when CuPy has working NCCL bindings, else None."""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415 - GPU machines only
    except Exception:
        return None
    return nccl if getattr(nccl, "available", True) else None


def sync_stream(arr) -> None:
    """Waits for the current CuPy stream before MPI reads or writes ``arr`` (no-op for NumPy)."""
    if not isinstance(arr, np.ndarray):
        import cupy  # noqa: PLC0415 - only reached with CuPy arrays
        cupy.cuda.get_current_stream().synchronize()


def _test_transfer(comm) -> bool:
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


_CHOSEN: dict = {}


def select(comm, device: bool, collective: str = "allreduce", probes: Probes | None = None) -> str:
    """Collective: the transport for ``collective`` on this run, agreed by all ranks, logged once."""
    key = (collective, device)
    if key in _CHOSEN:
        return _CHOSEN[key]
    if probes is None:
        probes = Probes(device, device and nccl_module() is not None,
                        mpi_cuda_query() if device else None, env_force())
    mine, why = choose(probes, collective, lambda: _test_transfer(comm))
    chosen = agree(comm, mine)
    if chosen != mine:
        why = f"another rank could not use {mine}"
    if comm.Get_rank() == 0 and device:
        log.info("device buffers (%s): %s (%s)", collective, chosen, why)
    _CHOSEN[key] = chosen
    return chosen


class NcclAllreduce:
    """In-place sum of a flat CuPy buffer over the ranks of ``comm`` with one NCCL all-reduce."""

    def __init__(self, comm, nccl=None):
        self.nccl = nccl or nccl_module()
        uid = self.nccl.get_unique_id() if comm.Get_rank() == 0 else None
        buf = np.array(uid if uid is not None else [0] * 128, dtype=np.int64)
        comm.Bcast(buf, root=0)                      # the id as raw numbers, not pickled
        self.comm = self.nccl.NcclCommunicator(comm.Get_size(), tuple(int(v) for v in buf),
                                               comm.Get_rank())

    def _dtype(self, arr):
        n = self.nccl
        return {"float32": n.NCCL_FLOAT32, "float64": n.NCCL_FLOAT64}[str(arr.dtype)]

    def sum_(self, arr) -> None:
        import cupy  # noqa: PLC0415
        stream = cupy.cuda.get_current_stream()
        self.comm.allReduce(arr.data.ptr, arr.data.ptr, arr.size, self._dtype(arr),
                            self.nccl.NCCL_SUM, stream.ptr)
