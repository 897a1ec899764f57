"""The one module that imports CuPy: array-module selection and GPU pinning.

Numerics code never imports this module to decide anything: it takes ``xp`` from its arrays
(:func:`get_array_module`).  ``select()`` is called once at start-up by the CLI.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from .choices import DEVICES, PRECISIONS
from .errors import BackendError  # noqa: F401 - re-exported: backend.BackendError

log = logging.getLogger("scalesgd")


@dataclass(frozen=True)
class Backend:
    """The array module in use and, on GPU, the CUDA device this rank is pinned to."""

    xp: ModuleType
    name: str                  # "numpy" or "cupy"
    device_id: int | None      # CUDA device ordinal, None on CPU

    @property
    def is_gpu(self) -> bool:
        return self.device_id is not None


def _try_cupy():
    """Returns (cupy module, number of GPUs) or (None, reason string)."""
    try:
        import cupy  # noqa: PLC0415 - the one place CuPy is imported
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return None, f"CuPy not importable ({type(exc).__name__}: {exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"no usable CUDA device ({exc})"
    if n < 1:
        return None, "no CUDA device"
    return cupy, n


def select(device: str = "auto", local_rank: int = 0) -> Backend:
    """Resolves ``cpu|gpu|auto`` to a Backend; on GPU pins device ``local_rank % n_gpus``.

    ``auto`` falls back to NumPy with one log line saying why; ``gpu`` raises BackendError instead.
    """
    if device not in DEVICES:
        raise BackendError(f"device: expected one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return Backend(np, "numpy", None)
    cupy, info = _try_cupy()
    if cupy is None:
        if device == "gpu":
            raise BackendError(f"--device gpu: {info}")
        log.info("device auto: using NumPy on the CPU: %s", info)
        return Backend(np, "numpy", None)
    dev = local_rank % info
    cupy.cuda.Device(dev).use()
    return Backend(cupy, "cupy", dev)


def set_precision(precision: str) -> None:
    """``tf32``: sets ``CUPY_TF32=1`` (CuPy reads it once, so this must precede the first float32
    matmul); ``fp32``/``bf16`` leave float32 GEMMs exact.  bf16 activations are the cuDNN path's
    business (nn/cudnn_conv.py).  Harmless on the CPU."""
    if precision not in PRECISIONS:
        raise BackendError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "tf32":
        os.environ["CUPY_TF32"] = "1"


def get_array_module(*arrays) -> ModuleType:
    """``cupy`` if any argument is a CuPy array, else ``numpy`` (without importing CuPy)."""
    for a in arrays:
        mod = type(a).__module__
        if mod.startswith("cupy"):
            import cupy  # noqa: PLC0415 - already imported by whoever made the array
            return cupy
    return np


def to_numpy(a) -> np.ndarray:
    """Host copy of an xp array (no-op for NumPy): only at I/O boundaries."""
    if isinstance(a, np.ndarray):
        return a
    return a.get()


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The variables by which a user or a site caps a process's BLAS/OpenMP threads
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_cap(env=None) -> tuple[int, str] | None:
    """The fewest threads one of ``THREAD_VARS`` asks for (OMP_NUM_THREADS's first level where it
    lists several), and that variable; None where none is set to a whole number >= 1."""
    env = os.environ if env is None else env
    caps = []
    for var in THREAD_VARS:
        v = str(env.get(var, "")).split(",")[0].strip()
        if v.isdigit() and int(v) >= 1:
            caps.append((int(v), var))
    return min(caps, default=None)


def blas_threads_for(local_size: int, cores: int | None = None, env=None) -> int:
    """Threads per rank so that ranks-per-node x threads does not exceed the node's cores, and
    never more than ``thread_cap`` (an OMP_NUM_THREADS=1 the user set is kept: threadpoolctl would
    otherwise raise OpenBLAS above it)."""
    if cores is None:
        cores = usable_cores()
    n = max(1, (cores or 1) // max(1, local_size))
    cap = thread_cap(env)
    return n if cap is None else min(n, cap[0])


def set_blas_threads(n: int) -> None:
    """Caps BLAS/OpenMP threads of this process at ``n`` (threadpoolctl, effective at run time)."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415
    threadpool_limits(limits=n)
