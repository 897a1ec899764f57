"""Forward/backward pairs with explicit caches, written against ``xp`` (NumPy or CuPy).

Layout: activations are NHWC, ``x: (N, H, W, C)``; conv weights are HWIO, ``w: (KH, KW, C, F)``
(the convolutions and their algorithms are in :mod:`.conv`, re-exported here).  Linear weights are
``(in, out)``.

Conventions:
- ``*_forward(...) -> (out, cache)``; ``*_backward(dout, cache, ...) -> dx`` (plus parameter grads).
- Parameter gradients are written into caller-provided arrays (``dw=...``), normally views into the
  flat gradient buffer, so backward allocates nothing for them.
- ``relu_backward`` and ``bn_relu_backward`` may overwrite ``dout``; every other backward leaves
  ``dout`` intact (the residual add needs it twice).
- Everything keeps the dtype of its inputs, so the float64 gradient checks run the same code.
"""
from __future__ import annotations

import math

from ..backend import get_array_module
from .conv import (BLOCK_BYTES, BLOCKED_ABOVE, Workspace, _out_size, col2im, conv2d_backward,  # noqa: F401
                   conv2d_forward, conv_plan, gemm, im2col)


# ----------------------------------------------------------------------------- batch norm
# Per-channel sums over M rows in two stages, so that the float32 error does not grow with M (a
# plain float32 GEMV over 802,816 rows is off by ~4e-4 relative; this stays near 1e-7, see
# benchmarks/bn_accuracy.py): stage 1 folds the rows into _FOLD-term sums in the input dtype by
# one GEMV / einsum over a (_FOLD, b*C) view (rows i, i+b, i+2b, ...); stage 2 adds the (b, C)
# partials and the < _FOLD leftover rows in float64 (1/_FOLD of the data).  Results keep a2's dtype.
_FOLD = 128


def _split(a2):
    """(_FOLD, b*C) view of the first _FOLD*b rows (None when M < _FOLD), and the leftover rows."""
    m, c = a2.shape
    b = m // _FOLD
    if b == 0:
        return None, a2, c
    return a2[:_FOLD * b].reshape(_FOLD, b * c), a2[_FOLD * b:], c


def _finish(xp, part, rest64, c, dtype):
    """float64 total of the (b*C,) stage-1 partials and the (C,) leftover sum, cast to ``dtype``."""
    total = rest64 if part is None else part.astype(xp.float64).reshape(-1, c).sum(axis=0) + rest64
    return total.astype(dtype, copy=False)


def _colsum(a2):
    """Column sums of a (M, C) array (see _FOLD): a GEMV, faster than sum(axis=0) for small C."""
    xp = get_array_module(a2)
    main, rest, c = _split(a2)
    part = None if main is None else xp.ones(_FOLD, dtype=a2.dtype) @ main
    return _finish(xp, part, rest.astype(xp.float64).sum(axis=0), c, a2.dtype)


def _coldot(a2, b2):
    """Per-column dot products sum_i a[i, c] * b[i, c] of two (M, C) arrays (see _FOLD)."""
    xp = get_array_module(a2)
    (ma, ra, c), (mb, rb, _) = _split(a2), _split(b2)
    part = None if ma is None else xp.einsum("ij,ij->j", ma, mb)
    rest = xp.einsum("ij,ij->j", ra.astype(xp.float64), rb.astype(xp.float64))
    return _finish(xp, part, rest, c, a2.dtype)


# A per-channel broadcast over an (M, C) array runs NumPy's inner loop C elements at a time: for
# C = 16 that is 1.5-1.9x slower than the same pass over rows of ~1024 elements (measured in
# benchmarks/bench_cpu.py's profile).  _wide views the rows k at a time and tiles the (C,) vectors k
# times, which gives the same elements the same operations in the same order: bitwise the same.
_WIDE = 1024


def _wide(a2, *vecs):
    """(M, C) contiguous -> ((M/k, k*C) view, each (C,) vector tiled k times), k = gcd(M, _WIDE/C)."""
    xp = get_array_module(a2)
    m, c = a2.shape
    k = math.gcd(m, max(1, _WIDE // c))
    return a2.reshape(m // k, k * c), [xp.tile(v, k) for v in vecs]


def batchnorm_forward(x, gamma, beta, running_mean, running_var, train: bool,
                      momentum: float = 0.1, eps: float = 1e-5):
    """x: (..., C) -> out (same shape).  Normalises over every axis but the last.

    train=True: batch statistics; running_mean/var (C,) updated in place with ``momentum``
    (running_var gets the unbiased batch variance, as in PyTorch).  train=False: running stats.
    """
    xp = get_array_module(x)
    c = x.shape[-1]
    x2 = xp.ascontiguousarray(x).reshape(-1, c)
    m = x2.shape[0]
    if not train:
        scale = gamma / (running_var + eps) ** 0.5
        xw, (sw, bw) = _wide(x2, scale, beta - running_mean * scale)
        out = xw * sw
        out += bw
        return out.reshape(x.shape), None
    mean = _colsum(x2) / m
    xw, (mw,) = _wide(x2, mean)
    xc = (xw - mw).reshape(m, c)                  # centred input, cached (x-hat = xc * invstd)
    var = _coldot(xc, xc) / m                     # two-pass variance: no cancellation in float32
    invstd = 1.0 / (var + eps) ** 0.5
    xcw, (sw, bw) = _wide(xc, gamma * invstd, beta)
    out = xcw * sw
    out += bw
    running_mean *= 1.0 - momentum
    running_mean += momentum * mean
    running_var *= 1.0 - momentum
    running_var += (momentum * m / max(m - 1, 1)) * var
    return out.reshape(x.shape), (xc, gamma, invstd)


def batchnorm_backward(dout, cache, dgamma, dbeta):
    """dout: (..., C) -> dx (same shape); writes dL/dgamma, dL/dbeta (C,) into the given arrays."""
    xp = get_array_module(dout)
    xc, gamma, invstd = cache
    c = dout.shape[-1]
    dy = xp.ascontiguousarray(dout).reshape(-1, c)
    m = dy.shape[0]
    dbeta[...] = _colsum(dy)
    dgamma[...] = _coldot(dy, xc) * invstd        # sum(dy * x-hat)
    xcw, (a, b, g) = _wide(xc, invstd * dgamma / m, dbeta / m, -(gamma * invstd))
    dx = xcw * a                                  # = x-hat * dgamma / m
    dx -= dy.reshape(dx.shape)
    dx += b
    dx *= g                                       # dx = g*invstd*(dy - dbeta/m - xhat*dgamma/m)
    return dx.reshape(dout.shape)


# ----------------------------------------------------------------------------- relu
def relu_forward(x, inplace: bool = False):
    """out = max(x, 0); cache is the output (its sign is the mask)."""
    xp = get_array_module(x)
    out = xp.maximum(x, 0, out=x if inplace else None)
    return out, out


def relu_backward(dout, cache):
    """dx = dout where out > 0 else 0.  Overwrites and returns ``dout``."""
    xp = get_array_module(dout)
    xp.multiply(dout, cache > 0, out=dout)
    return dout


# ----------------------------------------------------------------------------- pooling
def maxpool_forward(x, k: int = 3, stride: int = 2, pad: int = 1):
    """x: (N, H, W, C) -> (N, Ho, Wo, C), padding counts as -inf."""
    xp = get_array_module(x)
    n, h, w, c = x.shape
    ho, wo = _out_size(h, k, stride, pad), _out_size(w, k, stride, pad)
    xpad = xp.full((n, h + 2 * pad, w + 2 * pad, c), -xp.inf, dtype=x.dtype)
    xpad[:, pad:pad + h, pad:pad + w, :] = x
    wins = [xpad[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :]
            for i in range(k) for j in range(k)]
    out = wins[0].copy()
    for v in wins[1:]:
        xp.maximum(out, v, out=out)
    # argmax over the k*k window positions (first maximum wins, like a sequential scan); by
    # ``where``, not a boolean mask: CuPy's mask assignment reads the mask's count on the host (a
    # sync, which a CUDA graph's capture refuses)
    arg = xp.full(out.shape, k * k, dtype=xp.int8)
    for t in range(k * k - 1, -1, -1):
        arg = xp.where(wins[t] == out, xp.int8(t), arg)
    return out, (arg, x.shape, k, stride, pad)


def maxpool_backward(dout, cache):
    """Routes each output gradient to the input position that held the maximum."""
    xp = get_array_module(dout)
    arg, x_shape, k, stride, pad = cache
    n, h, w, c = x_shape
    ho, wo = dout.shape[1], dout.shape[2]
    dxpad = xp.zeros((n, h + 2 * pad, w + 2 * pad, c), dtype=dout.dtype)
    for t in range(k * k):
        i, j = divmod(t, k)
        dxpad[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :] += dout * (arg == t)
    return dxpad[:, pad:pad + h, pad:pad + w, :]


def avgpool_forward(x):
    """Global average pool: (N, H, W, C) -> (N, C)."""
    n, h, w, c = x.shape
    return x.reshape(n, h * w, c).mean(axis=1), x.shape


def avgpool_backward(dout, x_shape):
    xp = get_array_module(dout)
    n, h, w, c = x_shape
    dx = xp.empty(x_shape, dtype=dout.dtype)
    dx[...] = (dout / (h * w))[:, None, None, :]
    return dx


# ----------------------------------------------------------------------------- linear and loss
def linear_forward(x, w, b):
    """x: (N, D), w: (D, K), b: (K,) -> (N, K)."""
    out = x @ w
    out += b
    return out, (x, w)


def linear_backward(dout, cache, dw, db):
    """dout: (N, K) -> dx (N, D); writes dL/dw (D, K) and dL/db (K,)."""
    xp = get_array_module(dout)
    x, w = cache
    xp.matmul(x.T, dout, out=dw)
    db[...] = dout.sum(axis=0)
    return dout @ w.T


def softmax_cross_entropy(logits, labels, label_smoothing: float = 0.0):
    """logits: (N, K), labels: (N,) int -> (mean loss, dL/dlogits (N, K), predictions (N,)).

    Target distribution q = (1 - eps) * onehot + eps / K (eps = label_smoothing).
    """
    xp = get_array_module(logits)
    n, k = logits.shape
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    rows = xp.arange(n)
    nll = -logp[rows, labels]
    if label_smoothing:
        loss = (1.0 - label_smoothing) * nll - label_smoothing * logp.mean(axis=1)
    else:
        loss = nll
    grad = xp.exp(logp)
    grad[rows, labels] -= 1.0 - label_smoothing
    if label_smoothing:
        grad -= label_smoothing / k
    grad /= n
    return loss.mean(), grad, logits.argmax(axis=1)
