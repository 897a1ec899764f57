"""Forward/backward pairs with explicit caches, written against ``xp`` (NumPy or CuPy).

Layout: activations are NHWC, ``x: (N, H, W, C)``; conv weights are HWIO, ``w: (KH, KW, C, F)``,
so that im2col gives ``cols: (N*Ho*Wo, KH*KW*C)`` and one GEMM ``cols @ w.reshape(-1, F)`` yields the
output already in NHWC, with no transpose.  Linear weights are ``(in, out)``.

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
from ..choices import CONV_ALGOS


# ----------------------------------------------------------------------------- convolution
class Workspace:
    """Scratch buffers a layer reuses from step to step, keyed by (name, shape, dtype).

    Reuse avoids re-faulting large allocations (glibc maps every array above 32 MiB afresh) and
    re-zeroing padding: a padded buffer is zeroed once and afterwards only its interior is written.
    Consequence: a cache from ``forward`` is valid until the next forward of the same shape through
    the same layer.  Every hand-out of a buffer bumps its generation; a cache keeps the generation
    it was made at (:meth:`stamp`) and backward refuses a cache whose buffer was handed out again
    (:meth:`check`) instead of silently computing gradients from another batch.
    """

    def __init__(self):
        self._bufs: dict = {}
        self._gen: dict = {}         # key -> number of hand-outs of that buffer

    def zeros(self, xp, name: str, shape, dtype):
        key = (name, tuple(shape), str(dtype))
        buf = self._bufs.get(key)
        if buf is None:
            buf = self._bufs[key] = xp.zeros(shape, dtype=dtype)
        self._gen[key] = self._gen.get(key, 0) + 1
        return buf

    def stamp(self, name: str, shape, dtype) -> tuple:
        """(workspace, key, generation) of the buffer last handed out under (name, shape, dtype)."""
        key = (name, tuple(shape), str(dtype))
        return self, key, self._gen[key]

    @staticmethod
    def check(stamp, what: str) -> None:
        """Raises if the buffer behind ``stamp`` was handed out again since the stamp was taken."""
        ws, key, gen = stamp
        if ws._gen[key] != gen:
            raise RuntimeError(
                f"{what}: stale forward cache: a later forward with the same shapes through this "
                f"layer overwrote its im2col buffer {key[1]}; run backward before the next forward "
                f"(an eval forward included), or give that forward its own Workspace")


def _scratch(ws, xp, name, shape, dtype):
    """A zero-initialised buffer: from the workspace when there is one, else freshly allocated."""
    return xp.zeros(shape, dtype=dtype) if ws is None else ws.zeros(xp, name, shape, dtype)


def _out_size(n: int, k: int, stride: int, pad: int) -> int:
    return (n + 2 * pad - k) // stride + 1


def im2col(x, kh: int, kw: int, stride: int, pad: int, ws: Workspace | None = None):
    """x: (N, H, W, C) -> cols: (N*Ho*Wo, KH*KW*C), rows ordered (n, ho, wo), columns (i, j, c)."""
    xp = get_array_module(x)
    n, h, w, c = x.shape
    if pad:
        xpad = _scratch(ws, xp, "pad", (n, h + 2 * pad, w + 2 * pad, c), x.dtype)  # border stays 0
        xpad[:, pad:pad + h, pad:pad + w, :] = x
    else:
        xpad = x
    ho, wo = _out_size(h, kh, stride, pad), _out_size(w, kw, stride, pad)
    sn, sh, sw, sc = xpad.strides
    win = xp.lib.stride_tricks.as_strided(
        xpad, (n, ho, wo, kh, kw, c), (sn, sh * stride, sw * stride, sh, sw, sc))
    cols = _scratch(ws, xp, "cols", (n, ho, wo, kh, kw, c), x.dtype)
    cols[...] = win                      # one strided copy; reshape below is free
    return cols.reshape(n * ho * wo, kh * kw * c)


def _valid_range(size_in: int, size_out: int, k_off: int, stride: int, pad: int):
    """Output rows o with 0 <= o*stride + k_off - pad < size_in, as (o_lo, o_hi, i_lo)."""
    o_lo = max(0, -(-(pad - k_off) // stride))
    o_hi = min(size_out, (size_in - 1 + pad - k_off) // stride + 1)
    return o_lo, o_hi, o_lo * stride + k_off - pad


def col2im(dcols, x_shape, kh: int, kw: int, stride: int, pad: int, out=None):
    """Adjoint of :func:`im2col`: dcols (N*Ho*Wo, KH*KW*C) -> dx (N, H, W, C), summing overlaps.

    Accumulates straight into the unpadded dx with clipped slices (no padded buffer, no crop copy);
    ``out`` (an (N, H, W, C) array or view, overwritten) receives it instead of a fresh array."""
    xp = get_array_module(dcols)
    n, h, w, c = x_shape
    ho, wo = _out_size(h, kh, stride, pad), _out_size(w, kw, stride, pad)
    d6 = dcols.reshape(n, ho, wo, kh, kw, c)
    if out is None:
        dx = xp.zeros(x_shape, dtype=dcols.dtype)
    else:
        dx = out
        dx[...] = 0
    for i in range(kh):
        oh0, oh1, ih0 = _valid_range(h, ho, i, stride, pad)
        for j in range(kw):
            ow0, ow1, iw0 = _valid_range(w, wo, j, stride, pad)
            if oh1 <= oh0 or ow1 <= ow0:
                continue
            dx[:, ih0:ih0 + stride * (oh1 - oh0):stride, iw0:iw0 + stride * (ow1 - ow0):stride, :] += \
                d6[:, oh0:oh1, ow0:ow1, i, j, :]
    return dx


# ----------------------------------------------------------------------------- conv algorithms
# ``im2col``: one im2col buffer for the whole batch and one GEMM per layer and pass (the reference;
# what a GPU runs).  ``blocked``: the batch in blocks of images whose im2col rows fit the CPU's
# per-core L2 cache (BLOCK_BYTES), im2col + GEMM per block: the copy is written and read back from L2
# instead of memory, and the forward keeps x (not the 9x larger im2col matrix) for backward, which
# rebuilds each block's columns.  Measured (benchmarks/bench_cpu.py, docs/benchmarks.md): ResNet-20's
# 32x32x16 convs run ~1.8x faster per layer, the 8x8x64 ones break even.  ``auto``: ``blocked`` for
# NumPy arrays, ``im2col`` for CuPy ones (a GPU has no per-core cache to fit).
BLOCK_BYTES = 1 << 20            # im2col bytes per block: ~half the L2 of one core of this machine


def conv_block(algo: str, xp, x_shape, kh: int, kw: int, stride: int, pad: int, itemsize: int):
    """Images per block for ``algo`` at this geometry; None = the whole batch at once."""
    if algo not in CONV_ALGOS:
        raise ValueError(f"conv algorithm {algo!r}: choose from {', '.join(CONV_ALGOS)}")
    if algo == "im2col" or (algo == "auto" and xp.__name__ != "numpy") or (kh == kw == 1 and pad == 0):
        return None
    n, h, w, c = x_shape
    per_image = _out_size(h, kh, stride, pad) * _out_size(w, kw, stride, pad) * kh * kw * c * itemsize
    block = max(1, BLOCK_BYTES // max(per_image, 1))
    return None if block >= n else block


def conv2d_forward(x, w, stride: int = 1, pad: int = 0, ws: Workspace | None = None,
                   block: int | None = None):
    """x: (N, H, W, C), w: (KH, KW, C, F) -> out: (N, Ho, Wo, F).  No bias.

    ``block``: images per im2col + GEMM (see :func:`conv_block`); None = the whole batch.  With a
    workspace the im2col buffers are reused (see :class:`Workspace`)."""
    xp = get_array_module(x)
    n, h, wd, c = x.shape
    kh, kw, c2, f = w.shape
    assert c == c2, f"conv: input has {c} channels, weight expects {c2}"
    if kh == kw == 1 and pad == 0:
        xs = x[:, ::stride, ::stride, :] if stride > 1 else x
        cols = xp.ascontiguousarray(xs).reshape(-1, c)
        ho, wo = xs.shape[1], xs.shape[2]
        stamp = None                     # cols is x itself or a fresh copy: never reused
    elif block is not None and block < n:
        ho, wo = _out_size(h, kh, stride, pad), _out_size(wd, kw, stride, pad)
        out = xp.empty((n, ho, wo, f), dtype=xp.result_type(x.dtype, w.dtype))
        w2 = w.reshape(-1, f)
        for i in range(0, n, block):
            xp.matmul(im2col(x[i:i + block], kh, kw, stride, pad, ws), w2,
                      out=out[i:i + block].reshape(-1, f))
        return out, (None, x.shape, w, stride, pad, None, x, block)
    else:
        cols = im2col(x, kh, kw, stride, pad, ws)
        ho, wo = _out_size(h, kh, stride, pad), _out_size(wd, kw, stride, pad)
        stamp = None if ws is None else ws.stamp("cols", (n, ho, wo, kh, kw, c), x.dtype)
    out = cols @ w.reshape(-1, f)
    return out.reshape(n, ho, wo, f), (cols, x.shape, w, stride, pad, stamp, None, None)


def _same(kh: int, kw: int, stride: int, pad: int) -> bool:
    """A stride-1 "same" convolution, whose adjoint is the same convolution of the flipped kernel."""
    return stride == 1 and kh == kw and kh % 2 == 1 and pad == kh // 2 and kh > 1


def _adjoint_weight(xp, w):
    """The flipped, in/out-transposed kernel: dx of a "same" conv = conv(dout, this)."""
    return xp.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2))


def conv2d_backward(dout, cache, dw, need_dx: bool = True, ws: Workspace | None = None):
    """dout: (N, Ho, Wo, F) -> dx: (N, H, W, C) (None unless need_dx); writes dL/dw into ``dw``.

    dw is computed first, so the forward's im2col buffer is free again for dout's im2col.
    Raises RuntimeError if that buffer was reused by another forward since ``cache`` was made."""
    xp = get_array_module(dout)
    cols, x_shape, w, stride, pad, stamp, x, block = cache
    if x is not None:
        return _conv2d_backward_blocked(dout, x, w, stride, pad, block, dw, need_dx, ws)
    if stamp is not None:
        Workspace.check(stamp, "conv2d_backward")
    kh, kw, c, f = w.shape
    d2 = dout.reshape(-1, f)
    xp.matmul(cols.T, d2, out=dw.reshape(-1, f))
    if not need_dx:
        return None
    if _same(kh, kw, stride, pad):
        # im2col + GEMM of the adjoint conv beats GEMM + col2im's 9 strided adds ~2x
        return conv2d_forward(dout, _adjoint_weight(xp, w), 1, pad, ws)[0]
    dcols = d2 @ w.reshape(-1, f).T
    if kh == kw == 1 and pad == 0:
        if stride == 1:
            return dcols.reshape(x_shape)
        dx = xp.zeros(x_shape, dtype=dout.dtype)
        dx[:, ::stride, ::stride, :] = dcols.reshape(dout.shape[:3] + (c,))
        return dx
    return col2im(dcols, x_shape, kh, kw, stride, pad)


def _conv2d_backward_blocked(dout, x, w, stride, pad, block, dw, need_dx, ws):
    """Backward of a blocked forward: per block, im2col of x again -> dW partial, then dx."""
    xp = get_array_module(dout)
    kh, kw, c, f = w.shape
    n = x.shape[0]
    dw2 = dw.reshape(-1, f)
    part = xp.empty_like(dw2)
    for i in range(0, n, block):
        cols = im2col(x[i:i + block], kh, kw, stride, pad, ws)
        d2 = dout[i:i + block].reshape(-1, f)
        if i == 0:
            xp.matmul(cols.T, d2, out=dw2)
        else:
            xp.matmul(cols.T, d2, out=part)
            dw2 += part
    if not need_dx:
        return None
    dx = xp.empty(x.shape, dtype=dout.dtype)
    if _same(kh, kw, stride, pad):
        w_adj = _adjoint_weight(xp, w).reshape(-1, c)
        for i in range(0, n, block):
            xp.matmul(im2col(dout[i:i + block], kh, kw, 1, pad, ws), w_adj,
                      out=dx[i:i + block].reshape(-1, c))
        return dx
    wt = w.reshape(-1, f).T
    for i in range(0, n, block):
        d2 = dout[i:i + block].reshape(-1, f)
        col2im(d2 @ wt, dx[i:i + block].shape, kh, kw, stride, pad, out=dx[i:i + block])
    return dx


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
    # argmax over the k*k window positions (first maximum wins, like a sequential scan)
    arg = xp.full(out.shape, k * k, dtype=xp.int8)
    for t in range(k * k - 1, -1, -1):
        arg[wins[t] == out] = t
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
