"""Convolutions on ``xp`` (NumPy or CuPy), NHWC activations and HWIO weights, and their algorithms.

``x: (N, H, W, C)``, ``w: (KH, KW, C, F)``: im2col gives ``cols: (N*Ho*Wo, KH*KW*C)`` and one GEMM
``cols @ w.reshape(-1, F)`` yields the output already in NHWC, with no transpose.  Four algorithms
(``model.conv_algo``; :func:`conv_plan` picks one per layer and shape):

- ``im2col``: one im2col matrix for the whole batch and one GEMM per pass (the reference, and what a
  GPU runs).  The forward caches the im2col matrix for backward's dW GEMM.
- ``blocked``: the batch in blocks of images whose im2col rows fill about BLOCK_BYTES (half of one
  core's L2 cache here), im2col + GEMM per block, so the 9x copy is written and read back from cache
  instead of memory.  The forward caches x, not the 9x larger matrix; backward rebuilds each block's
  columns (dW sums the blocks' partial GEMMs).
- ``taps`` (stride-1 "same" convolutions, the 3x3 convs that dominate a ResNet; the others as
  ``auto``): image by image, the padded image's rows are copied with the kernel's width taps only
  (a KW x copy instead of KH x KW, from and to cache), and the product is one GEMM per kernel row on a
  row-shifted view of that matrix, summed.  dW is the same GEMMs transposed, dX the same convolution
  of dout with the flipped kernel.
- ``winograd`` (3x3, stride 1, pad 1; the others as ``auto``): Winograd F(4x4, 3x3), or F(2x2, 3x3)
  on images under 4x4 (:mod:`.winograd`): 4x fewer multiplications as 36 batched GEMMs, paid for with
  transforms that are memory passes over 2.25x the input, so it wins from 64 channels up.  Its float32
  rounding is ~10x a direct convolution's (measured in ``benchmarks/conv_candidates.py``).
- ``auto``: on NumPy ``winograd`` for 3x3 stride-1 layers with at least WINOGRAD_MIN_CHANNELS input
  channels on images of at least WINOGRAD_MIN_SIZE; else ``taps`` where it applies and an image has
  at least TAPS_MIN_PIXELS pixels and TAPS_MIN_MACS multiply-adds (below either, its per-image calls
  cost more than they save: 8x8 images, or the crossover proxy's 8-channel 16x16 ones); else
  ``blocked`` where the whole batch's im2col matrix exceeds BLOCKED_ABOVE (an ImageNet stem's is
  470 MB at batch 64) and a block has at least F rows (so that summing dW's partials costs less than
  the block); else ``im2col``.  On CuPy
  ``im2col`` (a GPU has no per-core cache to fit, and big GEMMs suit it).  The measured table behind
  these thresholds: ``benchmarks/conv_candidates.py`` (docs/benchmarks.md).

All give the same results to float32 rounding (Winograd's larger) and pass the same float64
finite-difference checks (tests/test_layers.py, tests/test_resnet.py).  Measured per conv geometry by
``benchmarks/conv_candidates.py`` and per step by ``benchmarks/bench_cpu.py`` (docs/benchmarks.md).
"""
from __future__ import annotations

from ..backend import get_array_module
from ..choices import CONV_ALGOS
from . import winograd as WG

BLOCK_BYTES = 1 << 20            # blocked: im2col bytes per block (~half of one core's L2 here)
BLOCKED_ABOVE = 16 << 20         # auto: blocked only where the whole batch's im2col is larger
TAPS_MIN_PIXELS = 256            # auto: taps from 16x16 images up (measured: conv_candidates.py)
TAPS_MIN_MACS = 1 << 20          # ... and from 1M multiply-adds per image (bench_cpu.py's proxy)
WINOGRAD_MIN_CHANNELS = 64       # auto: Winograd F(4x4, 3x3) from 64 input channels ...
WINOGRAD_MIN_SIZE = 8            # ... on images of at least 8x8 (2x2 tiles)


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


def gemm(a, b, out=None):
    """``a @ b`` (into ``out`` when given): every convolution GEMM goes through here, so that the CPU
    profile (benchmarks/cpu_profile.py) can time each one with its shape."""
    return get_array_module(a).matmul(a, b, out=out)


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



# ----------------------------------------------------------------------------- algorithm choice
def _same(kh: int, kw: int, stride: int, pad: int) -> bool:
    """A stride-1 "same" convolution, whose adjoint is the same convolution of the flipped kernel."""
    return stride == 1 and kh == kw and kh % 2 == 1 and pad == kh // 2 and kh > 1


def conv_plan(algo: str, xp, x_shape, kh: int, kw: int, stride: int, pad: int, itemsize: int,
              f: int = 1):
    """How a layer runs under ``algo`` (``model.conv_algo``): None (the whole batch at once, im2col),
    ``("blocked", images per block)``, ``("taps", 1)`` or ``("winograd", tile size m)``; ``f``: the
    output channels (auto's multiply-add and dW-size rules use it)."""
    if algo not in CONV_ALGOS:
        raise ValueError(f"conv algorithm {algo!r}: choose from {', '.join(CONV_ALGOS)}")
    if algo == "im2col" or (algo == "auto" and xp.__name__ != "numpy") or (kh == kw == 1 and pad == 0):
        return None
    n, h, w, c = x_shape
    if kh == kw == 3 and stride == 1 and pad == 1 and (algo == "winograd" or (
            algo == "auto" and c >= WINOGRAD_MIN_CHANNELS and min(h, w) >= WINOGRAD_MIN_SIZE)):
        return "winograd", 4 if min(h, w) >= 4 else 2
    if _same(kh, kw, stride, pad) and (algo == "taps" or (
            algo == "auto" and h * w >= TAPS_MIN_PIXELS and h * w * kh * kw * c * f >= TAPS_MIN_MACS)):
        return "taps", 1
    rows = _out_size(h, kh, stride, pad) * _out_size(w, kw, stride, pad)
    per_image = rows * kh * kw * c * itemsize
    block = max(1, BLOCK_BYTES // max(per_image, 1))
    if block >= n or (algo != "blocked" and (n * per_image <= BLOCKED_ABOVE or block * rows < f)):
        return None                  # auto: a whole-batch matrix that fits, or dW partials (K x F
    blocks = -(-n // block)          # per block) larger than a block's im2col rows: one GEMM
    return "blocked", -(-n // blocks)             # equal blocks: 8 + 8, not 14 + 2


# ----------------------------------------------------------------------------- forward and backward
def conv2d_forward(x, w, stride: int = 1, pad: int = 0, ws: Workspace | None = None, plan=None):
    """x: (N, H, W, C), w: (KH, KW, C, F) -> out: (N, Ho, Wo, F).  No bias.

    ``plan``: from :func:`conv_plan`; None = whole-batch im2col.  With a workspace the im2col buffers
    are reused (see :class:`Workspace`)."""
    xp = get_array_module(x)
    n, h, wd, c = x.shape
    kh, kw, c2, f = w.shape
    assert c == c2, f"conv: input has {c} channels, weight expects {c2}"
    if kh == kw == 1 and pad == 0:
        xs = x[:, ::stride, ::stride, :] if stride > 1 else x
        cols = xp.ascontiguousarray(xs).reshape(-1, c)
        ho, wo = xs.shape[1], xs.shape[2]
        stamp = None                     # cols is x itself or a fresh copy: never reused
    elif plan is not None:
        if plan[0] == "winograd":        # the cache keeps the transformed input (2.25x x for m = 4)
            y, saved = WG.forward(x, w, plan[1])
            return y, (saved, x.shape, w, stride, pad, None, None, plan)
        block = plan[1]
        ho, wo = _out_size(h, kh, stride, pad), _out_size(wd, kw, stride, pad)
        out = xp.empty((n, ho, wo, f), dtype=xp.result_type(x.dtype, w.dtype))
        if plan[0] == "taps":
            _taps_conv(x, w, pad, ws, out)
            return out, (None, x.shape, w, stride, pad, None, x, plan)
        w2 = w.reshape(-1, f)
        for i in range(0, n, block):
            gemm(im2col(x[i:i + block], kh, kw, stride, pad, ws), w2, out=out[i:i + block].reshape(-1, f))
        return out, (None, x.shape, w, stride, pad, None, x, plan)
    else:
        cols = im2col(x, kh, kw, stride, pad, ws)
        ho, wo = _out_size(h, kh, stride, pad), _out_size(wd, kw, stride, pad)
        stamp = None if ws is None else ws.stamp("cols", (n, ho, wo, kh, kw, c), x.dtype)
    out = gemm(cols, w.reshape(-1, f))
    return out.reshape(n, ho, wo, f), (cols, x.shape, w, stride, pad, stamp, None, None)


def _dx_by_adjoint(x_shape, w_shape, stride: int, pad: int) -> bool:
    """dX of a "same" conv as the convolution of dout with the adjoint kernel (im2col of dout + GEMM)
    rather than GEMM + col2im (9 strided adds): ~2x faster where the images are large, but the adjoint
    kernel is a transposing copy of the weights (4 ms at 512 channels), which costs more than the
    adds where the rows (N*H*W) are fewer than the weight's C*F (ResNet-18's 8x8 to 2x2 stages)."""
    n, h, w, c = x_shape
    return _same(w_shape[0], w_shape[1], stride, pad) and n * h * w >= c * w_shape[3]


def _adjoint_weight(xp, w):
    """The flipped, in/out-transposed kernel: dx of a "same" conv = conv(dout, this)."""
    return xp.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2))


def conv2d_backward(dout, cache, dw, need_dx: bool = True, ws: Workspace | None = None):
    """dout: (N, Ho, Wo, F) -> dx: (N, H, W, C) (None unless need_dx); writes dL/dw into ``dw``.

    dw is computed first, so the forward's im2col buffer is free again for dout's im2col.
    Raises RuntimeError if that buffer was reused by another forward since ``cache`` was made."""
    xp = get_array_module(dout)
    cols, x_shape, w, stride, pad, stamp, x, plan = cache
    if plan is not None:
        if plan[0] == "winograd":
            return WG.backward(dout, cols, dw, need_dx)
        if plan[0] == "taps":
            _taps_dw(dout, x, w, pad, dw, ws)
            if not need_dx:
                return None
            dx = xp.empty(x_shape, dtype=dout.dtype)
            _taps_conv(dout, _adjoint_weight(xp, w), pad, ws, dx)
            return dx
        return _blocked_backward(dout, x, w, stride, pad, plan[1], dw, need_dx, ws)
    if stamp is not None:
        Workspace.check(stamp, "conv2d_backward")
    kh, kw, c, f = w.shape
    d2 = dout.reshape(-1, f)
    gemm(cols.T, d2, out=dw.reshape(-1, f))
    if not need_dx:
        return None
    if _dx_by_adjoint(x_shape, w.shape, stride, pad):
        return conv2d_forward(dout, _adjoint_weight(xp, w), 1, pad, ws)[0]
    dcols = gemm(d2, w.reshape(-1, f).T)
    if kh == kw == 1 and pad == 0:
        if stride == 1:
            return dcols.reshape(x_shape)
        dx = xp.zeros(x_shape, dtype=dout.dtype)
        dx[:, ::stride, ::stride, :] = dcols.reshape(dout.shape[:3] + (c,))
        return dx
    return col2im(dcols, x_shape, kh, kw, stride, pad)


class _Accumulate:
    """dW summed over blocks: the first block's GEMM writes into the destination, later ones into a
    scratch array that is then added (NumPy's matmul cannot accumulate)."""

    def __init__(self, xp, dest, ws, name: str = "dw_part"):
        self.dest, self.started = dest, False
        self.part = _scratch(ws, xp, name, dest.shape, dest.dtype)

    def __call__(self, a, b):
        if not self.started:
            gemm(a, b, out=self.dest)
            self.started = True
        else:
            gemm(a, b, out=self.part)
            self.dest += self.part


def _blocked_backward(dout, x, w, stride, pad, block, dw, need_dx, ws):
    """Backward of a blocked forward: per block, im2col of x again -> dW partial, then dx."""
    xp = get_array_module(dout)
    kh, kw, _, f = w.shape
    n = x.shape[0]
    acc = _Accumulate(xp, dw.reshape(-1, f), ws)
    for i in range(0, n, block):
        acc(im2col(x[i:i + block], kh, kw, stride, pad, ws).T, dout[i:i + block].reshape(-1, f))
    if not need_dx:
        return None
    if _dx_by_adjoint(x.shape, w.shape, stride, pad):     # the blocked forward of the adjoint conv
        return conv2d_forward(dout, _adjoint_weight(xp, w), 1, pad, ws, ("blocked", block))[0]
    dx = xp.empty(x.shape, dtype=dout.dtype)
    wt = w.reshape(-1, f).T
    for i in range(0, n, block):
        d2 = dout[i:i + block].reshape(-1, f)
        col2im(gemm(d2, wt), dx[i:i + block].shape, kh, kw, stride, pad, out=dx[i:i + block])
    return dx


# ----------------------------------------------------------------------------- taps (stride 1, same)
class _Taps:
    """The width-tap matrix of one padded image and its per-kernel-row views (built once per call;
    the buffers come from the workspace, the padded border is zeroed once)."""

    def __init__(self, ws, xp, h: int, w: int, c: int, kh: int, kw: int, pad: int, dtype):
        hp = h + 2 * pad
        xpad = _scratch(ws, xp, "taps_pad", (hp, w + 2 * pad, c), dtype)
        self.inner = xpad[pad:pad + h, pad:pad + w]
        s = xpad.strides                    # row r, column j of the taps: padded row r, cols j..j+KW-1
        self.win = xp.lib.stride_tricks.as_strided(xpad, (hp, w, kw * c), (s[0], s[1], s[2]))
        self.taps = _scratch(ws, xp, "taps", (hp, w, kw * c), dtype)
        t2 = self.taps.reshape(hp * w, kw * c)
        self.rows = [t2[i * w:i * w + h * w] for i in range(kh)]    # kernel row i: shifted by i rows

    def load(self, image) -> None:
        self.inner[...] = image
        self.taps[...] = self.win


def _taps_conv(x, w, pad: int, ws, out) -> None:
    """out[...] = the stride-1 "same" convolution of x (N, H, W, C) with w, image by image."""
    xp = get_array_module(x)
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    t = _Taps(ws, xp, h, wd, c, kh, kw, pad, x.dtype)
    wrows = [w[i].reshape(kw * c, f) for i in range(kh)]
    part = _scratch(ws, xp, "taps_part", (h * wd, f), out.dtype)
    for i in range(n):
        t.load(x[i])
        y = out[i].reshape(h * wd, f)
        gemm(t.rows[0], wrows[0], out=y)
        for k in range(1, kh):
            gemm(t.rows[k], wrows[k], out=part)
            y += part


def _taps_dw(dout, x, w, pad: int, dw, ws) -> None:
    """dW[i] = sum over images of (taps shifted by kernel row i)^T @ dout."""
    xp = get_array_module(dout)
    n, h, wd, c = x.shape
    kh, kw, _, f = w.shape
    t = _Taps(ws, xp, h, wd, c, kh, kw, pad, x.dtype)
    accs = [_Accumulate(xp, dw[i].reshape(kw * c, f), ws, f"dw_part{i}") for i in range(kh)]
    for i in range(n):
        t.load(x[i])
        d2 = dout[i].reshape(h * wd, f)
        for k in range(kh):
            accs[k](t.rows[k].T, d2)
