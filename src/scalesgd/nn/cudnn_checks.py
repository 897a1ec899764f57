"""Small-input runners of the cuDNN engine for the start-up self-check (``fastpaths/``), split
from ``cudnn_conv.py`` (they import it; it does not import them): each returns (fast,
reference) runners of one conv geometry or BN shape."""
from __future__ import annotations

import numpy as np

from .cudnn_conv import out_hw


# ----------------------------------------------------------------------------- start-up checks
# Small-input runners for the self-check (fastpaths/): ``engine`` is the run's CudnnEngine (or any
# object with its conv_/bn_ methods, ``xp`` and ``io_dtype``); the reference is the im2col / xp
# layers on the same values in float32.  Inputs are random (never zeros), the same on every rank;
# gradient outputs are poisoned with NaN first, so an output cuDNN never writes cannot pass.
def _stub(**kw):
    """A stand-in for a Conv / BatchNorm module: the attributes the engine reads and writes."""
    from types import SimpleNamespace  # noqa: PLC0415
    return SimpleNamespace(**kw)


def conv_check(engine, x_shape, w_shape, stride: int, pad: int, seed: int = 0, need_dx: bool = True):
    """(fast, reference) runners of one conv geometry, x: (N, H, W, C) and w: HWIO (R, S, C, K);
    each returns (y, dx, dw): fprop, dgrad and wgrad of the same x, w and dy ((y, dw) without
    ``need_dx``: the stem's dgrad graph is never built by a run)."""
    from . import layers as L  # noqa: PLC0415
    xp = engine.xp
    rng = np.random.default_rng([seed, *x_shape, *w_shape, stride, pad])
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[:3]))).astype(np.float32)
    ho, wo = out_hw(x_shape[1], x_shape[2], w_shape[0], w_shape[1], stride, pad)
    dy = rng.standard_normal((x_shape[0], ho, wo, w_shape[3])).astype(np.float32)
    io = engine.io_dtype                  # the reference sees the values the engine sees

    def fast():
        mod = _stub(w=xp.asarray(w), dw=xp.full(w_shape, np.nan, xp.float32), stride=stride, pad=pad)
        y, cache = engine.conv_forward(mod, xp.asarray(x).astype(io), True)
        dx = engine.conv_backward(mod, xp.asarray(dy).astype(io), cache, need_dx)
        return (y, dx, mod.dw) if need_dx else (y, mod.dw)

    def reference():
        xr, wr, dyr = (xp.asarray(a).astype(io).astype(xp.float32) for a in (x, w, dy))
        y, cache = L.conv2d_forward(xr, wr, stride, pad)
        dw = xp.empty(w_shape, xp.float32)
        dx = L.conv2d_backward(dyr, cache, dw, need_dx)
        return (y, dx, dw) if need_dx else (y, dw)
    return fast, reference


def bn_check(engine, x_shape, relu: bool, seed: int = 0):
    """(fast, reference) runners of training BN (+ReLU) over x: (N, H, W, C); each returns
    (y, dx, dgamma, dbeta, running_mean, running_var) after one forward and backward."""
    from . import layers as L  # noqa: PLC0415
    xp, c = engine.xp, x_shape[-1]
    rng = np.random.default_rng([seed, *x_shape, relu])
    x = (rng.standard_normal(x_shape) * 2 + 0.5).astype(np.float32)
    gamma, beta = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    dy = rng.standard_normal(x_shape).astype(np.float32)
    io = engine.io_dtype

    def module():
        nan = lambda: xp.full(c, np.nan, xp.float32)  # noqa: E731
        return _stub(gamma=xp.asarray(gamma), beta=xp.asarray(beta), rmean=xp.zeros(c, xp.float32),
                     rvar=xp.ones(c, xp.float32), dgamma=nan(), dbeta=nan(), relu=relu)

    def fast():
        mod = module()
        y, cache = engine.bn_forward(mod, xp.asarray(x).astype(io), True)
        dx = engine.bn_backward(mod, xp.asarray(dy).astype(io), cache)
        return y, dx, mod.dgamma, mod.dbeta, mod.rmean, mod.rvar

    def reference():
        mod = module()
        xr, dyr = (xp.asarray(a).astype(io).astype(xp.float32) for a in (x, dy))
        y, cache = L.batchnorm_forward(xr, mod.gamma, mod.beta, mod.rmean, mod.rvar, True)
        if relu:
            y = xp.maximum(y, 0)
            dyr = dyr * (y > 0)
        dx = L.batchnorm_backward(dyr, cache, mod.dgamma, mod.dbeta)
        return y, dx, mod.dgamma, mod.dbeta, mod.rmean, mod.rvar
    return fast, reference
