"""Fused element-wise CuPy kernels, each with an xp reference twin (docs/architecture.md).

Every public kernel function here takes xp arrays and picks its implementation from them:

- NumPy arrays: the reference twin, plain xp code
  with the exact semantics of the unfused layers in :mod:`layers` / :class:`optim.sgd.SGD` (tests
  check the twins against them);
- CuPy arrays: one ``RawKernel`` launch from the CUDA C source :data:`KERNELS_CU`, compiled once per
  (activation dtype, parameter dtype) by NVRTC.  CuPy is never imported here: the module comes from
  the arrays (``backend.get_array_module``), so importing this file works without CuPy.

Which of the two CuPy arrays get in a run is its :class:`Kernels` object, built from the config key
``model.kernels`` (``fused`` | ``reference``) by the run's set-up and passed to the model and the
optimizer; nothing is read from the environment and nothing is kept per process.  The start-up
self-check (fastpaths/) runs each kernel on small inputs (:func:`check_case`) and turns one that
fails off (:meth:`Kernels.disable`): its twin runs instead.

Kernels (one pass over memory each, where the unfused code makes 2-4):

- ``bn_apply``       y = x * scale[c] + shift[c], optionally ReLU'd (BN forward's apply part);
- ``add_relu``       h = max(h + s, 0) in place (the residual join);
- ``sgd_update``     the whole SGD/Nesterov/weight-decay step over the flat buffer, in place.

Channels are the last (fastest) axis (NHWC), so element ``i`` belongs to channel ``i % C``.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..choices import KERNEL_IMPLS

_BLOCK = 256
_MAX_GRID = 65535 * 8

# ----------------------------------------------------------------------------- CUDA C source
_HEADER = """\
#include <cuda_bf16.h>
typedef {act} T;   /* activation storage type */
typedef {par} P;   /* parameter (master weight) type */
typedef {acc} A;   /* arithmetic type */
"""

KERNELS_CU = r"""
/* loads/stores through overloads, so one source serves float, double and bf16 storage */
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ double ld(double v) { return v; }
__device__ __forceinline__ float ld(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void st(float* p, A v) { *p = (float)v; }
__device__ __forceinline__ void st(double* p, A v) { *p = (double)v; }
__device__ __forceinline__ void st(__nv_bfloat16* p, A v) { *p = __float2bfloat16((float)v); }

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

extern "C" __global__ void bn_apply(const T* __restrict__ x, const A* __restrict__ scale,
                                    const A* __restrict__ shift, T* __restrict__ y,
                                    long long n, int C, int relu) {
    GRID_STRIDE(i, n) {
        int c = (int)(i % C);
        A v = (A)ld(x[i]) * scale[c] + shift[c];
        if (relu && v < (A)0) v = (A)0;
        st(&y[i], v);
    }
}

extern "C" __global__ void add_relu(T* __restrict__ h, const T* __restrict__ s, long long n) {
    GRID_STRIDE(i, n) {
        A v = (A)ld(h[i]) + (A)ld(s[i]);
        st(&h[i], v < (A)0 ? (A)0 : v);          /* NaN stays NaN, as xp.maximum keeps it */
    }
}

extern "C" __global__ void sgd_update(P* __restrict__ p, const P* __restrict__ g,
                                      P* __restrict__ buf, const P* __restrict__ mask,
                                      long long n, double lr, double mu, double wd,
                                      int nesterov, int has_mask) {
    GRID_STRIDE(i, n) {
        P pi = p[i];
        P d = g[i] + (P)wd * (has_mask ? mask[i] : (P)1) * pi;
        if (mu != 0.0) {
            P bi = (P)mu * buf[i] + d;
            buf[i] = bi;
            d = nesterov ? d + (P)mu * bi : bi;
        }
        p[i] = pi - (P)lr * d;
    }
}
"""

_CTYPES = {"float32": "float", "float64": "double", "bfloat16": "__nv_bfloat16"}
KERNEL_NAMES = ("bn_apply", "add_relu", "sgd_update")


def module_source(act_dtype: str = "float32", param_dtype: str = "float32") -> str:
    """The full CUDA C translation unit for one (activation, parameter) dtype pair."""
    acc = "double" if act_dtype == "float64" else "float"
    return _HEADER.format(act=_CTYPES[act_dtype], par=_CTYPES[param_dtype], acc=acc) + KERNELS_CU


def dtype_name(dtype) -> str:
    """'float32' | 'float64' | 'bfloat16' (also for ml_dtypes' bfloat16)."""
    name = "bfloat16" if str(dtype) == "bfloat16" else str(np.dtype(dtype))
    if name not in _CTYPES:
        raise TypeError(f"kernels: unsupported dtype {dtype}")
    return name


def launch_config(n: int, block: int = _BLOCK) -> tuple[tuple[int], tuple[int]]:
    """(grid, block) for a grid-stride loop over n elements (never an empty grid)."""
    return (max(1, min(-(-n // block), _MAX_GRID)),), (block,)


def use_fast(*arrays) -> bool:
    """True for CuPy arrays: the module-level kernels below then launch the fused CUDA kernel."""
    return get_array_module(*arrays) is not np


class Kernels:
    """One run's choice of kernels (``model.kernels``), owned by its set-up and handed to the model,
    the optimizer and the cuDNN engine that call them (``ResNet(kernels=...)``, ``SGD(kernels=...)``):

    - ``impl``: ``fused`` (CuPy arrays run the CUDA kernels) or ``reference`` (the xp twins for
      every array, to compare against the fused kernels);
    - :meth:`disable`: the start-up check (fastpaths/) turns a fused kernel that failed off for
      this run, in the activation dtype it failed in (or every dtype); its ``_ref`` twin runs
      instead, and the same kernel in another dtype that passed stays on.

    A new ``Kernels`` starts with every kernel on; nothing is shared between runs of one process."""

    def __init__(self, impl: str = "fused"):
        if impl not in KERNEL_IMPLS:
            raise ValueError(f"model.kernels: expected one of {', '.join(KERNEL_IMPLS)}, got {impl!r}")
        self.impl = impl
        self._disabled: set = set()

    def disable(self, name: str, dtype: str | None = None) -> None:
        """Turns the fused kernel ``name`` off for this run (its ``_ref`` twin runs instead): for
        arrays of ``dtype`` (a :func:`dtype_name`; the kernel's first array) or, None, for all."""
        if name not in KERNEL_NAMES:
            raise ValueError(f"kernels: no kernel {name!r} (known: {', '.join(KERNEL_NAMES)})")
        self._disabled.add(name if dtype is None else (name, dtype_name(dtype)))

    @property
    def disabled(self) -> frozenset:
        """The fused kernels turned off by :meth:`disable`: names (every dtype) and (name, dtype)."""
        return frozenset(self._disabled)

    def use_fast(self, *arrays, kernel: str | None = None) -> bool:
        """True when the fused CUDA kernel should run: CuPy arrays, ``impl = fused`` and (when
        named) ``kernel`` not turned off by :meth:`disable` for the first array's dtype."""
        if self.impl != "fused" or not use_fast(*arrays):
            return False
        return kernel is None or (kernel not in self._disabled
                                  and (kernel, dtype_name(arrays[0].dtype)) not in self._disabled)

    def bn_apply(self, x, scale, shift, relu: bool, out=None):
        fast = self.use_fast(x, kernel="bn_apply")
        return (bn_apply if fast else bn_apply_ref)(x, scale, shift, relu, out)

    def add_relu(self, h, s):
        return (add_relu if self.use_fast(h, s, kernel="add_relu") else add_relu_ref)(h, s)

    def sgd_update(self, p, g, buf, mask, lr: float, mu: float, wd: float, nesterov: bool):
        fast = self.use_fast(p, g, kernel="sgd_update")
        return (sgd_update if fast else sgd_update_ref)(p, g, buf, mask, lr, mu, wd, nesterov)


_MODULES: dict = {}


def _kernel(xp, name: str, act: str, par: str = "float32"):
    """The compiled kernel ``name`` (one RawModule per dtype pair, compiled on first use)."""
    key = (act, par)
    mod = _MODULES.get(key)
    if mod is None:
        mod = _MODULES[key] = xp.RawModule(code=module_source(act, par), options=("--std=c++17",))
    return mod.get_function(name)


def _param_for(act: str) -> str:
    """Parameter dtype paired with an activation dtype (bf16 activations keep float32 masters)."""
    return "float64" if act == "float64" else "float32"


def _launch(xp, name, act, par, n, args):
    grid, block = launch_config(n)
    _kernel(xp, name, act, par)(grid, block, args)


# ----------------------------------------------------------------------------- BN apply (+ ReLU)
def bn_apply_ref(x, scale, shift, relu: bool, out=None):
    """Reference: y = x * scale + shift (per channel, last axis), then max(y, 0) if relu."""
    xp = get_array_module(x)
    y = xp.multiply(x, scale.astype(x.dtype, copy=False), out=out)
    y += shift.astype(x.dtype, copy=False)
    if relu:
        xp.maximum(y, 0, out=y)
    return y


def bn_apply(x, scale, shift, relu: bool, out=None):
    """Fused BN apply (+ ReLU): ``scale = gamma*invstd``, ``shift = beta - mean*scale``, shape (C,)."""
    if not use_fast(x):
        return bn_apply_ref(x, scale, shift, relu, out)
    xp = get_array_module(x)
    out = xp.empty_like(x) if out is None else out
    act = dtype_name(x.dtype)
    adt = xp.float64 if act == "float64" else xp.float32
    args = (x, scale.astype(adt), shift.astype(adt), out, np.int64(x.size), np.int32(x.shape[-1]),
            np.int32(relu))
    _launch(xp, "bn_apply", act, _param_for(act), x.size, args)
    return out


# ----------------------------------------------------------------------------- residual add + ReLU
def add_relu_ref(h, s):
    """Reference: h = max(h + s, 0), in place; returns h."""
    xp = get_array_module(h)
    h += s
    return xp.maximum(h, 0, out=h)


def add_relu(h, s):
    """Fused residual join: h <- relu(h + s) in place (h contiguous, same shape and dtype as s)."""
    if not use_fast(h, s):
        return add_relu_ref(h, s)
    xp = get_array_module(h)
    act = dtype_name(h.dtype)
    _launch(xp, "add_relu", act, _param_for(act), h.size, (h, xp.ascontiguousarray(s), np.int64(h.size)))
    return h


# ----------------------------------------------------------------------------- SGD update
def sgd_update_ref(p, g, buf, mask, lr, mu, wd, nesterov: bool):
    """Reference, optim.sgd semantics: d = g + wd*mask*p; buf = mu*buf + d;
    p -= lr*(d + mu*buf) if nesterov else lr*buf  (mu == 0: p -= lr*d, buf untouched)."""
    d = g + wd * (p if mask is None else mask * p)
    if mu:
        buf *= mu
        buf += d
        d = d + mu * buf if nesterov else buf
    p -= lr * d
    return p


def sgd_update(p, g, buf, mask, lr: float, mu: float, wd: float, nesterov: bool):
    """The whole optimizer step over the flat buffers in ONE kernel (CuPy) or the reference."""
    if not use_fast(p, g):
        return sgd_update_ref(p, g, buf, mask, lr, mu, wd, nesterov)
    xp = get_array_module(p)
    par = dtype_name(p.dtype)
    m = p if mask is None else mask                     # any valid pointer when has_mask == 0
    _launch(xp, "sgd_update", par, par, p.size,
            (p, g, buf, m, np.int64(p.size), np.float64(lr), np.float64(mu), np.float64(wd),
             np.int32(bool(nesterov)), np.int32(mask is not None)))
    return p


# ----------------------------------------------------------------------------- start-up checks
def _np_dtype(name: str):
    """NumPy dtype of a kernels dtype name ('bfloat16' from ml_dtypes, as the cuDNN path uses)."""
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 - bf16 runs only
        return ml_dtypes.bfloat16
    return np.dtype(name)


CASES = {"bn_apply": ("random", "nan"), "add_relu": ("random", "nan"),
         "sgd_update": ("random", "nan", "no mask", "no momentum")}


def check_case(name: str, xp, act: str = "float32", par: str = "float32", seed: int = 0, fast=None,
               case: str = "random"):
    """(fast, reference): two runners of kernel ``name`` on the same small random inputs (never
    zeros; sizes not multiples of the block), each returning a tuple of arrays.

    ``fast()`` calls the public function (the fused kernel for CuPy arrays unless turned off; the
    caller may pass another ``fast`` with the same signature), on inputs in ``act`` (activations) /
    ``par`` (parameters); ``reference()`` calls the ``_ref`` twin on the same values widened to
    float32 (float64 for float64 runs), so a bf16 kernel is checked against float32 arithmetic.
    ``case`` (one of ``CASES[name]``): ``random``; ``nan``: some inputs NaN, which must come out
    NaN where the twin's do (a kernel that turns NaN into 0 hides a diverging run); for
    ``sgd_update`` also ``no mask`` (weight decay on every parameter) and ``no momentum`` (plain
    SGD), the kernel's other branches.  Used by the start-up self-check (fastpaths/); the inputs
    are the same on every rank."""
    if name not in KERNEL_NAMES:
        raise ValueError(f"kernels: no kernel {name!r} (known: {', '.join(KERNEL_NAMES)})")
    if case not in CASES[name]:
        raise ValueError(f"kernels: {name} has no case {case!r} (known: {', '.join(CASES[name])})")
    rng = np.random.default_rng([seed, KERNEL_NAMES.index(name), CASES[name].index(case)])
    wide = "float64" if "float64" in (act, par) else "float32"
    fast = fast or globals()[name]

    def values(shape, scale=1.0, shift=0.0, poison=False):
        v = rng.standard_normal(shape) * scale + shift
        if poison and case == "nan":             # a few NaN, in the middle of the buffer
            v.reshape(-1)[1::97] = np.nan
        return v

    def pair(a, dt):             # fresh copies of (the kernel's input, the same values widened)
        a = a.astype(_np_dtype(dt))
        return (lambda: xp.array(a)), (lambda: xp.array(a.astype(wide)))

    if name == "bn_apply":       # x: (2, 5, 7, 24) NHWC, scale/shift: (24,)
        x, sc, sh = (pair(v, dt) for v, dt in ((values((2, 5, 7, 24), 2, 0.3, poison=True), act),
                                               (values(24), par), (values(24), par)))
        return (lambda: (fast(x[0](), sc[0](), sh[0](), True),),
                lambda: (bn_apply_ref(x[1](), sc[1](), sh[1](), True),))
    if name == "add_relu":       # h, s: (3, 7, 5, 16); h is updated in place
        h, s = (pair(values((3, 7, 5, 16), poison=i == 0), act) for i in range(2))
        return (lambda: (fast(h[0](), s[0]()),), lambda: (add_relu_ref(h[1](), s[1]()),))
    n = 1001                     # sgd_update: flat buffers (n,), Nesterov, masked weight decay
    p, g, buf = (pair(values(n, poison=i == 1), par) for i in range(3))
    mask = pair((rng.random(n) < 0.6).astype(np.float64), par)
    mu = 0.0 if case == "no momentum" else 0.9

    def step(which, fn):
        pv, bv = p[which](), buf[which]()
        fn(pv, g[which](), bv, None if case == "no mask" else mask[which](), 0.1, mu, 1e-2, True)
        return pv, bv
    return (lambda: step(0, fast)), (lambda: step(1, sgd_update_ref))
