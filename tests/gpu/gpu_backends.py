"""The backends a parity test body runs on (the idea of CuPy's ``numpy_cupy_allclose``: one test body
written against ``xp`` runs once per array module, and its outputs are compared with a reference).
Here every body's float32 outputs are compared with the same body run in float64 on NumPy, so the
NumPy case checks the reference path itself and the CuPy cases check the GPU paths against it.
Without CuPy and a GPU the CuPy cases are skipped with the reason ``no GPU/CuPy``; with one,
``python -m pytest tests/gpu`` runs them all in one call (benchmarks/gpu_check.sh does).

The ``cudnn-double`` path runs everywhere: the real ``CudnnEngine`` (graph building, weight copies,
packs, BN statistics) over NumPy, its graphs executed by the cuDNN Frontend stand-in with the
bindings' real signatures (tests/cudnn_stub.py), so the engine's logic is checked in every CI run."""
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from scalesgd.fastpaths import compare
from scalesgd.nn import layers as L

NO_GPU = "no GPU/CuPy"


def _cupy():
    """The cupy module when it imports and sees a GPU, else None."""
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # noqa: BLE001 - not importable, or no driver / device
        return None


CUPY = _cupy()


def _cudnn():
    """The cudnn frontend module (only probed with a GPU), else None."""
    if CUPY is None:
        return None
    from scalesgd.nn import cudnn_conv as CC
    return CC.probe_cudnn()


CUDNN = _cudnn()


@dataclass
class Path:
    """Where a body runs: an array module, the cuDNN engine or None (the xp layers), and the
    normwise tolerance of its float32 outputs against the float64 NumPy run."""

    name: str
    xp: ModuleType
    engine: object
    tol: float


def make_path(name: str) -> Path:
    if name == "numpy":
        return Path(name, np, None, 1e-5)
    if name == "cupy":
        return Path(name, CUPY, None, 1e-5)
    from scalesgd.nn import cudnn_conv as CC       # cuDNN may run float32 convolutions in TF32
    if name == "cudnn-double":
        import cudnn_stub
        return Path(name, np, CC.CudnnEngine(cudnn_stub.module(), cudnn_stub.HostXP(), "fp32"), 1e-5)
    return Path(name, CUPY, CC.CudnnEngine(CUDNN, CUPY, "fp32"), 2e-3)


NEEDS_GPU = pytest.mark.skipif(CUPY is None, reason=NO_GPU)
XP = [pytest.param("numpy"), pytest.param("cupy", marks=NEEDS_GPU)]
PATHS = XP + [pytest.param("cupy-cudnn", marks=[NEEDS_GPU, pytest.mark.skipif(
    CUPY is not None and CUDNN is None, reason="cudnn frontend not importable")]),
                  pytest.param("cudnn-double")]
FLOAT64 = Path("numpy-float64", np, None, 0.0)          # the reference every body is compared with


def assert_close(got, want, tol: float, names=(), what: str = "") -> None:
    """Every output of ``got`` within ``tol`` of ``want`` (``||a - b|| / ||b||``, finite, same shape)."""
    err, why = compare(got, want, tol, tuple(names))
    assert why is None, f"{what}: {why}"


# ----------------------------------------------------------------------------- layer runners
def conv(path: Path, x, w, dy, stride: int, pad: int):
    """(y, dx, dw) of one convolution on ``path``; gradient outputs start as NaN."""
    xp = path.xp
    dw = xp.full(w.shape, np.nan, dtype=w.dtype)
    if path.engine is not None:
        mod = SimpleNamespace(w=xp.asarray(w), dw=dw, stride=stride, pad=pad)
        y, cache = path.engine.conv_forward(mod, xp.asarray(x), True)
        return y, path.engine.conv_backward(mod, xp.asarray(dy), cache, True), mod.dw
    y, cache = L.conv2d_forward(xp.asarray(x), xp.asarray(w), stride, pad)
    return y, L.conv2d_backward(xp.asarray(dy), cache, dw, True), dw


def batchnorm(path: Path, x, gamma, beta, dy, relu: bool):
    """(y, dx, dgamma, dbeta, running_mean, running_var) of training BN (+ReLU) on ``path``."""
    xp, c, dt = path.xp, x.shape[-1], x.dtype
    mod = SimpleNamespace(gamma=xp.asarray(gamma), beta=xp.asarray(beta), rmean=xp.zeros(c, dt),
                          rvar=xp.ones(c, dt), dgamma=xp.full(c, np.nan, dt), dbeta=xp.full(c, np.nan, dt),
                          relu=relu)
    if path.engine is not None:
        y, cache = path.engine.bn_forward(mod, xp.asarray(x), True)
        dx = path.engine.bn_backward(mod, xp.asarray(dy), cache)
    else:
        y, cache = L.batchnorm_forward(xp.asarray(x), mod.gamma, mod.beta, mod.rmean, mod.rvar, True)
        d = xp.array(dy)
        if relu:
            y = xp.maximum(y, 0)
            d *= y > 0
        dx = L.batchnorm_backward(d, cache, mod.dgamma, mod.dbeta)
    return y, dx, mod.dgamma, mod.dbeta, mod.rmean, mod.rvar
