"""Winograd convolution F(m x m, 3 x 3) (Lavin & Gray 2016) for stride-1, pad-1 3x3 layers, forward and
backward, as batched GEMMs on ``xp`` (NumPy or CuPy), NHWC activations and HWIO weights.

The input is cut into overlapping alpha x alpha tiles (alpha = m + 2, stride m) and each output tile is

    y = A^T [ (G g G^T)  .*  (B^T d B) ] A            (per channel pair, summed over input channels)

so the alpha^2 transform points are alpha^2 independent GEMMs ``V[p] (T x C) @ U[p] (C x F)`` over the T
tiles: (m + 2)^2 multiplications per m^2 outputs instead of 9 m^2 (F(4x4, 3x3): 4x fewer).  The
transforms are small GEMMs along the tile axes.  Layouts: V and M are (alpha * alpha, T, C | F) with the
point index p = b * alpha + a (a: the row transform's index, b: the column one); tiles are (n, ty, tx).

Backward is the exact adjoint of that computation (so the float64 finite-difference checks hold to
rounding): dM = A dY A^T per output tile, dU[p] = V[p]^T dM[p] (dW = G^T dU G), dV[p] = dM[p] U[p]^T,
and dX is B dV B^T scattered back onto the overlapping tiles.  The forward caches V (alpha^2 / m^2 =
2.25x the input for m = 4).  In float32 its rounding is larger than a direct convolution's: measured by
``benchmarks/conv_candidates.py`` (about 1e-5 of the largest output for m = 4, against 7e-7).
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module

_MATRICES = {
    2: dict(BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
            G=[[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]],
            AT=[[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: dict(BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
            G=[[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
               [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
            AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
TILES = tuple(_MATRICES)


def _mats(xp, m: int, dtype):
    return tuple(xp.asarray(np.asarray(_MATRICES[m][k], dtype=np.float64), dtype=dtype)
                 for k in ("BT", "G", "AT"))


def _weights(xp, w, g):
    """U (alpha^2, C, F), point p = b * alpha + a: U[b, a] = sum_kl G[a, k] G[b, l] w[k, l]."""
    _, _, c, f = w.shape
    a = g.shape[0]
    t = g @ w.reshape(3, 3 * c * f)                                   # rows: (a, l, c, f)
    u = xp.matmul(g, t.reshape(a, 3, c * f))                          # (a, b, c*f)
    return xp.ascontiguousarray(u.transpose(1, 0, 2)).reshape(a * a, c, f)


def forward(x, w, m: int = 4):
    """x: (N, H, W, C), w: (3, 3, C, F) -> (out (N, H, W, F), cache); stride 1, pad 1."""
    xp = get_array_module(x)
    n, h, wd, c = x.shape
    f = w.shape[3]
    bt, g, at = _mats(xp, m, x.dtype)
    a = m + 2
    th, tw = -(-h // m), -(-wd // m)
    xpad = xp.zeros((n, m * th + 2, m * tw + 2, c), dtype=x.dtype)
    xpad[:, 1:1 + h, 1:1 + wd] = x
    s = xpad.strides
    rows = xp.lib.stride_tricks.as_strided(xpad, (n, th, a, xpad.shape[2] * c), (s[0], m * s[1], s[1], s[3]))
    t1 = xp.matmul(bt, rows).reshape(n, th, a, xpad.shape[2], c)       # rows transformed: (n, ty, a, col, c)
    s = t1.strides
    tiles = xp.empty((a, a, n, th, tw, c), dtype=x.dtype)             # (col in tile, a, n, ty, tx, c)
    tiles[...] = xp.lib.stride_tricks.as_strided(t1, tiles.shape, (s[3], s[2], s[0], s[1], m * s[3], s[4]))
    v = (bt @ tiles.reshape(a, -1)).reshape(a * a, n * th * tw, c)     # columns transformed
    u = _weights(xp, w, g)
    mm = xp.matmul(v, u).reshape(a, a, -1)                            # (b, a, T*F)
    y = (at @ xp.matmul(at, mm).reshape(a, -1)).reshape(m, m, n, th, tw, f)   # (j, i, n, ty, tx, f)
    out = xp.empty((n, m * th, m * tw, f), dtype=x.dtype)
    out.reshape(n, th, m, tw, m, f)[...] = y.transpose(2, 3, 1, 4, 0, 5)
    if m * th != h or m * tw != wd:
        out = xp.ascontiguousarray(out[:, :h, :wd])
    return out, (v, u, x.shape, m)


def backward(dout, cache, dw, need_dx: bool = True):
    """dout: (N, H, W, F) -> dx (None unless need_dx); writes dL/dw (3, 3, C, F) into ``dw``."""
    xp = get_array_module(dout)
    v, u, (n, h, wd, c), m = cache
    f = dout.shape[3]
    bt, g, at = _mats(xp, m, dout.dtype)
    a = m + 2
    th, tw = -(-h // m), -(-wd // m)
    dy = xp.empty((m, m, n, th, tw, f), dtype=dout.dtype)             # (j, i, n, ty, tx, f)
    _scatter_tiles_out(xp, dy, dout, m, th, tw)
    dm1 = at.T @ dy.reshape(m, -1)                                    # (b, i, T*F)
    dm = xp.matmul(at.T, dm1.reshape(a, m, -1)).reshape(a * a, -1, f)  # (b, a, T, F)
    du = xp.matmul(v.transpose(0, 2, 1), dm)                          # (p, C, F)
    t = xp.matmul(g.T, du.reshape(a, a, -1))                          # (b, k, C*F)
    dwt = g.T @ t.reshape(a, -1)                                      # (l, k, C*F)
    dw[...] = dwt.reshape(3, 3, c, f).transpose(1, 0, 2, 3)
    if not need_dx:
        return None
    dv = xp.matmul(dm, u.transpose(0, 2, 1)).reshape(a, a, -1)        # (b, a, T*C)
    d1 = xp.matmul(bt.T, dv)                                          # (b, r, T*C)
    dd = (bt.T @ d1.reshape(a, -1)).reshape(a, a, n, th, tw, c)       # (s, r, n, ty, tx, c)
    dxpad = xp.zeros((n, m * th + 2, m * tw + 2, c), dtype=dout.dtype)
    for r in range(a):
        for s in range(a):
            dxpad[:, r:r + m * th:m, s:s + m * tw:m, :] += dd[s, r]
    return dxpad[:, 1:1 + h, 1:1 + wd].copy()


def _scatter_tiles_out(xp, dy, dout, m, th, tw):
    """dy[j, i, n, ty, tx, f] = dout[n, m*ty + i, m*tx + j, f] (zero beyond the image)."""
    n, h, wd, f = dout.shape
    full = dy.transpose(2, 3, 1, 4, 0, 5)                             # (n, ty, i, tx, j, f) view of dy
    if m * th == h and m * tw == wd:
        full[...] = dout.reshape(n, th, m, tw, m, f)
    else:
        pad = xp.zeros((n, m * th, m * tw, f), dtype=dout.dtype)
        pad[:, :h, :wd] = dout
        full[...] = pad.reshape(n, th, m, tw, m, f)
