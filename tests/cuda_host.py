"""A CPU double of the fused CUDA kernels: ``nn/kernels.py``'s own CUDA C source, compiled for the
host with the system C++ compiler and called through ctypes, so the kernels' arithmetic (not a
re-implementation of it) runs in every CI run without a GPU.

A small prelude stands in for what the source takes from CUDA: the qualifiers (``__global__``,
``__device__``, ``__forceinline__``, ``__restrict__``) become nothing or ``inline``; the grid
variables are globals set to one block of one thread, so each kernel's grid-stride loop visits every
element in order; ``__nv_bfloat16`` is a 16-bit struct with round-to-nearest-even conversions, as
``cuda_bf16.h`` does them.  What this does not model: concurrency, launch geometry, memory
coalescing, the device's own rounding of fused multiply-adds (the host compiler is told not to
contract, ``-ffp-contract=off``, so float results can differ from the device's by an FMA's rounding).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import numpy as np

from scalesgd.nn import kernels as K

PRELUDE = r"""
#include <cstdint>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
struct scalesgd_dim3 { long long x; };
static scalesgd_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
struct __nv_bfloat16 { uint16_t bits; };
static inline float __bfloat162float(__nv_bfloat16 v) {
    uint32_t u = (uint32_t)v.bits << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {      /* round to nearest, ties to even */
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { __nv_bfloat16 n = {(uint16_t)((u >> 16) | 0x40)}; return n; }
    u += 0x7fffu + ((u >> 16) & 1u);
    __nv_bfloat16 r = {(uint16_t)(u >> 16)}; return r;
}
"""

COMPILER = shutil.which("g++") or shutil.which("c++")
FLAGS = ["-x", "c++", "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC"]
_LIBS: dict = {}


def available() -> str | None:
    """None when the double can be built here, else why not (for a skip reason)."""
    return None if COMPILER else ("no C++ compiler (g++ or c++) on PATH: the CUDA source cannot be built "
                                  "for the host")


def host_source(act: str, par: str) -> str:
    """The translation unit nn/kernels.py would hand NVRTC, with the prelude instead of CUDA."""
    return PRELUDE + K.module_source(act, par).replace("#include <cuda_bf16.h>\n", "")


def library(act: str = "float32", par: str = "float32") -> ctypes.CDLL:
    """The kernels of one dtype pair built for the host (once per source text, cached on disk)."""
    src = host_source(act, par)
    key = hashlib.sha256("\0".join([str(COMPILER), *FLAGS, src]).encode()).hexdigest()[:16]
    if key not in _LIBS:
        out = Path(tempfile.gettempdir()) / f"scalesgd-cuda-host-{key}.so"
        if not out.exists():
            # a name of this process's own: two test workers building the same library at once
            # each write their own file, and the rename puts a whole one in place (never one that
            # another compiler is still writing into while a process maps it)
            tmp = out.with_suffix(f".{os.getpid()}.{uuid.uuid4().hex}.so")
            subprocess.run([COMPILER, *FLAGS, "-o", str(tmp), "-"], input=src, text=True, check=True,
                           capture_output=True)
            tmp.replace(out)
        _LIBS[key] = ctypes.CDLL(str(out))
    return _LIBS[key]


def _dtype_name(a: np.ndarray) -> str:
    return K.dtype_name(a.dtype)


def _ptr(a: np.ndarray):
    assert a.flags.c_contiguous, "the kernels take contiguous buffers"
    return ctypes.c_void_p(a.ctypes.data)


def _acc(act: str):
    """NumPy type of the kernels' arithmetic type A for activations ``act``."""
    return np.float64 if act == "float64" else np.float32


def bn_apply(x, scale, shift, relu: bool, out=None):
    """The signature of ``kernels.bn_apply``, run by the host-built CUDA kernel."""
    act = _dtype_name(x)
    out = np.empty_like(x) if out is None else out
    sc, sh = (np.ascontiguousarray(v, dtype=_acc(act)) for v in (scale, shift))
    library(act, K._param_for(act)).bn_apply(_ptr(x), _ptr(sc), _ptr(sh), _ptr(out),
                                            ctypes.c_longlong(x.size), ctypes.c_int(x.shape[-1]),
                                            ctypes.c_int(int(relu)))
    return out


def add_relu(h, s):
    act = _dtype_name(h)
    s = np.ascontiguousarray(s)
    library(act, K._param_for(act)).add_relu(_ptr(h), _ptr(s), ctypes.c_longlong(h.size))
    return h


def sgd_update(p, g, buf, mask, lr: float, mu: float, wd: float, nesterov: bool):
    par = _dtype_name(p)
    m = p if mask is None else mask
    library(par, par).sgd_update(_ptr(p), _ptr(g), _ptr(buf), _ptr(m), ctypes.c_longlong(p.size),
                                 ctypes.c_double(lr), ctypes.c_double(mu), ctypes.c_double(wd),
                                 ctypes.c_int(int(bool(nesterov))), ctypes.c_int(int(mask is not None)))
    return p


FAST = {"bn_apply": bn_apply, "add_relu": add_relu, "sgd_update": sgd_update}
