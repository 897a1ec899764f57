"""Convolutions and batch norm through cuDNN Frontend graphs, on the CuPy views of the flat buffers.

Run once on a GPU (one H200, 2026-12-04): the conv graphs and the fp32 BatchNorm agreed with their
references there (what ran and what did not: docs/gpu.md).  The im2col path of :mod:`layers` is the
reference twin and stays selectable (``model.conv_impl = "im2col"``).

Layout decisions (cuDNN describes every tensor by dims in N,C,H,W order plus strides):

- activations are our NHWC arrays as they are: dims [N, C, H, W], strides [HWC, 1, WC, C];
- conv weights are our HWIO views ``(R, S, C, K)`` of the flat parameter buffer.  cuDNN's NHWC
  kernels want the filter as KRSC (dims [K, C, R, S], strides [RSC, 1, SC, C]).  Decision: a
  **KRSC shadow** per conv layer, in the compute dtype (float32, or bf16 for ``precision=bf16``),
  refreshed by one transpose(+cast) at each forward, training and evaluation (the weights change
  once per step, or when a model is loaded;
  ResNet-50's 25.5 M weights are ~100 MB, ~50 us of copy at H200 bandwidth, vs GBs of activations).
  The shadow serves fprop and dgrad.  wgrad writes into a KRSC scratch (float32; with bf16 I/O a
  bf16 one, as every Frontend sample keeps dW in the I/O type, float32 where no engine takes that:
  ``build_wgrad``), then one transpose(+cast) lands it in the HWIO gradient view (master gradients
  stay float32, in the flat buffer).
  ``filter_desc(.., "hwio")`` (the buffer described through strides, zero copies) is kept as the
  first thing to try on a device: if cuDNN's heuristics support it, the shadow can go.
- graphs are built once per (op, shapes, stride, pad, dtypes, layout) -> :class:`GraphCache`.

Everything that needs no device (shapes, strides, keys, types, path selection, the sequence of
graph-building calls, checked against a fake ``cudnn`` module) lives in pure functions tested on CPU.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..choices import CONV_IMPLS, PRECISIONS

log = logging.getLogger("scalesgd")


# ----------------------------------------------------------------------------- pure functions
def out_hw(h: int, w: int, r: int, s: int, stride: int, pad: int) -> tuple[int, int]:
    return (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1


def nhwc_desc(shape_nhwc) -> tuple[list[int], list[int]]:
    """(dims in NCHW order, strides) of a contiguous NHWC array."""
    n, h, w, c = shape_nhwc
    return [n, c, h, w], [h * w * c, 1, w * c, c]


def filter_desc(shape_hwio, layout: str) -> tuple[list[int], list[int]]:
    """(dims [K, C, R, S], strides) of the filter: ``krsc`` (the shadow) or ``hwio`` (our buffer)."""
    r, s, c, k = shape_hwio
    if layout == "krsc":
        return [k, c, r, s], [r * s * c, 1, s * c, c]
    if layout == "hwio":
        return [k, c, r, s], [1, k, s * c * k, c * k]
    raise ValueError(f"filter layout: expected krsc or hwio, got {layout!r}")


def channel_desc(c: int) -> tuple[list[int], list[int]]:
    """(dims, strides) of a per-channel vector (BN scale/bias/stats) as [1, C, 1, 1]."""
    return [1, c, 1, 1], [c, 1, c, c]


def type_names(precision: str, param_dtype: str = "float32") -> dict:
    """cuDNN data-type names (``cudnn.data_type.<NAME>``) for io, compute and the filter gradient
    (``wgrad_out``, and ``wgrad_alt`` to try when no engine takes it, or None)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    if param_dtype == "float64":
        raise ValueError("cudnn path: float64 is not supported (use conv_impl=im2col)")
    io = "BFLOAT16" if precision == "bf16" else "FLOAT"
    # wgrad's dW: bf16 X/dY write a bf16 dW, as every cudnn-frontend sample keeps dW in the I/O type
    # (and PyTorch's autocast does); a FLOAT dW is the per-graph fallback (``build_wgrad``)
    return {"io": io, "compute": "FLOAT", "wgrad_out": io, "wgrad_alt": "FLOAT" if io != "FLOAT" else None,
            "tf32": precision == "tf32"}


def graph_key(op: str, x_shape, w_shape, stride: int, pad: int, precision: str,
              layout: str = "krsc") -> tuple:
    """Cache key of one graph: everything the built plan depends on, nothing else."""
    return (op, tuple(x_shape), tuple(w_shape), int(stride), int(pad), precision, layout)


def choose_conv_impl(requested: str, have_cupy: bool, have_cudnn: bool, have_gpu: bool,
                     dtype: str = "float32") -> tuple[str, str]:
    """('cudnn' | 'im2col', why).  ``cudnn`` requested but unusable raises; ``auto`` falls back."""
    if requested not in CONV_IMPLS:
        raise ValueError(f"conv_impl: expected one of {CONV_IMPLS}, got {requested!r}")
    missing = [what for what, ok in (("CuPy", have_cupy), ("a GPU", have_gpu),
                                     ("the cudnn frontend module", have_cudnn),
                                     ("float32 parameters", dtype == "float32")) if not ok]
    if requested == "im2col":
        return "im2col", "requested"
    if not missing:
        return "cudnn", "CuPy, a GPU and cuDNN Frontend are present"
    if requested == "cudnn":
        raise RuntimeError(f"conv_impl=cudnn: missing {', '.join(missing)}")
    return "im2col", f"auto: missing {', '.join(missing)}"


def probe_cudnn():
    """The ``cudnn`` (nvidia-cudnn-frontend) module, or None with the import error logged at debug."""
    try:
        import cudnn  # noqa: PLC0415 - optional dependency, GPU machines only
        return cudnn
    except Exception as exc:  # ImportError or a missing libcudnn
        log.debug("cudnn frontend not importable: %s", exc)
        return None


class GraphCache:
    """Built graphs keyed by :func:`graph_key`; ``builds`` counts how many were built."""

    def __init__(self):
        self._graphs: dict = {}
        self.builds = 0

    def get(self, key, build):
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = build()
            self.builds += 1
        return g

    def __len__(self):
        return len(self._graphs)


@dataclass
class Built:
    """A built graph, its named tensor handles and its workspace size in bytes."""

    graph: object
    tensors: dict
    workspace: int
    out_type: str = ""            # wgrad: the data type its DW is written in


# ----------------------------------------------------------------------------- graph building
def _finish(cudnn, g, tensors: dict, no_tensor_cores: bool = False) -> Built:
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if no_tensor_cores:          # filters the plans just made (Graph::deselect_numeric_notes)
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    g.check_support()
    g.build_plans()
    return Built(g, tensors, int(g.get_workspace_size()))


def _graph(cudnn, handle, types):
    dt = cudnn.data_type
    return dt, cudnn.pygraph(io_data_type=getattr(dt, types["io"]),
                             intermediate_data_type=dt.FLOAT,
                             compute_data_type=getattr(dt, types["compute"]), handle=handle)


def build_conv(cudnn, handle, op: str, x_shape, w_shape, stride: int, pad: int, precision: str,
               layout: str = "krsc", wgrad_out: str | None = None) -> Built:
    """One of fprop (X, W -> Y), dgrad (DY, W -> DX), wgrad (X, DY -> DW) for NHWC / HWIO shapes;
    ``wgrad_out``: DW's data type (default ``type_names``' ``wgrad_out``)."""
    types = type_names(precision)
    dt, g = _graph(cudnn, handle, types)
    io = getattr(dt, types["io"])
    n, h, w, c = x_shape
    r, s, _, k = w_shape
    ho, wo = out_hw(h, w, r, s, stride, pad)
    xd, wd, yd = nhwc_desc(x_shape), filter_desc(w_shape, layout), nhwc_desc((n, ho, wo, k))
    conv = dict(padding=[pad, pad], stride=[stride, stride], dilation=[1, 1],
                compute_data_type=dt.FLOAT)
    # precision fp32: no TF32 -- float convolutions on tensor cores run TF32 (10-bit mantissa), so
    # those plans are excluded, as PyTorch does when TF32 is off; tf32 and bf16 keep them
    strict = precision == "fp32"
    if op == "fprop":
        X = g.tensor(name="X", dim=xd[0], stride=xd[1], data_type=io)
        W = g.tensor(name="W", dim=wd[0], stride=wd[1], data_type=io)
        Y = g.conv_fprop(image=X, weight=W, name="fprop", **conv)
        Y.set_output(True).set_data_type(io)
        return _finish(cudnn, g, {"X": X, "W": W, "Y": Y}, strict)
    if op == "dgrad":
        DY = g.tensor(name="DY", dim=yd[0], stride=yd[1], data_type=io)
        W = g.tensor(name="W", dim=wd[0], stride=wd[1], data_type=io)
        DX = g.conv_dgrad(loss=DY, filter=W, name="dgrad", **conv)
        DX.set_output(True).set_dim(xd[0]).set_stride(xd[1]).set_data_type(io)
        return _finish(cudnn, g, {"DY": DY, "W": W, "DX": DX}, strict)
    if op == "wgrad":
        X = g.tensor(name="X", dim=xd[0], stride=xd[1], data_type=io)
        DY = g.tensor(name="DY", dim=yd[0], stride=yd[1], data_type=io)
        DW = g.conv_wgrad(image=X, loss=DY, name="wgrad", **conv)
        out = wgrad_out or types["wgrad_out"]
        DW.set_output(True).set_dim(wd[0]).set_stride(wd[1]).set_data_type(getattr(dt, out))
        built = _finish(cudnn, g, {"X": X, "DY": DY, "DW": DW}, strict)
        built.out_type = out
        return built
    raise ValueError(f"conv op: expected fprop, dgrad or wgrad, got {op!r}")


def build_wgrad(cudnn, handle, x_shape, w_shape, stride: int, pad: int, precision: str) -> Built:
    """The wgrad graph, its DW in ``type_names``' ``wgrad_out``, else (no engine for that graph,
    bf16 only) in ``wgrad_alt``: the fallback is per graph, never the whole model to im2col.  The
    engine casts DW into the float32 gradient view in its transpose (``Built.out_type``)."""
    types = type_names(precision)
    tried = []
    for out in (types["wgrad_out"], types["wgrad_alt"]):
        if out is None:
            continue
        try:
            return build_conv(cudnn, handle, "wgrad", x_shape, w_shape, stride, pad, precision,
                              wgrad_out=out)
        except Exception as exc:  # noqa: BLE001 - cudnnGraphNotSupportedError or a failed build
            tried.append((out, exc))
            log.debug("cudnn wgrad %s %s with dW %s: %s", x_shape, w_shape, out, exc)
    if len(tried) == 1:
        raise tried[0][1]
    raise RuntimeError("cudnn wgrad: no engine for " + "; ".join(
        f"dW {out} ({type(exc).__name__}: {exc})" for out, exc in tried)) from tried[-1][1]


def build_bn(cudnn, handle, op: str, x_shape, precision: str) -> Built:
    """Training BN forward (X, scale, bias, running stats -> Y, saved mean/invstd) or backward."""
    types = type_names(precision)
    dt, g = _graph(cudnn, handle, types)
    io = getattr(dt, types["io"])
    xd, cd = nhwc_desc(x_shape), channel_desc(x_shape[-1])
    X = g.tensor(name="X", dim=xd[0], stride=xd[1], data_type=io)
    vec = {nm: g.tensor(name=nm, dim=cd[0], stride=cd[1], data_type=dt.FLOAT)
           for nm in (("scale", "bias", "rmean", "rvar") if op == "fwd" else ("scale", "mean", "invstd"))}
    if op == "fwd":
        eps = g.tensor(name="eps", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True,
                       data_type=dt.FLOAT)
        mom = g.tensor(name="mom", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], is_pass_by_value=True,
                       data_type=dt.FLOAT)
        # pygraph.batchnorm is the training forward; it takes no phase argument (cudnn-frontend
        # v1.0.0 to v1.22, python/pygraph/norm.cpp: input, scale, bias, in_running_mean,
        # in_running_var, epsilon, momentum, peer_stats, compute_data_type, name)
        Y, mean, invstd, rm, rv = g.batchnorm(
            name="bn", input=X, scale=vec["scale"], bias=vec["bias"], in_running_mean=vec["rmean"],
            in_running_var=vec["rvar"], epsilon=eps, momentum=mom)
        Y.set_output(True).set_data_type(io)
        for t in (mean, invstd, rm, rv):
            t.set_output(True).set_data_type(dt.FLOAT)
        return _finish(cudnn, g, {"X": X, **vec, "eps": eps, "mom": mom, "Y": Y, "mean": mean,
                                  "invstd": invstd, "rmean_out": rm, "rvar_out": rv})
    DY = g.tensor(name="DY", dim=xd[0], stride=xd[1], data_type=io)
    DX, DS, DB = g.batchnorm_backward(name="dbn", grad=DY, input=X, scale=vec["scale"],
                                      mean=vec["mean"], inv_variance=vec["invstd"])
    DX.set_output(True).set_data_type(io)
    DS.set_output(True).set_data_type(dt.FLOAT)
    DB.set_output(True).set_data_type(dt.FLOAT)
    return _finish(cudnn, g, {"X": X, "DY": DY, **vec, "DX": DX, "DS": DS, "DB": DB})


# ----------------------------------------------------------------------------- execution (GPU only)
class CudnnEngine:
    """Runs conv and BN of a ResNet through cached cuDNN graphs on CuPy arrays (no staging copies).

    Attach with :func:`attach`; ``Conv``/``BatchNorm`` modules then call ``conv_forward`` etc.
    Inference-mode BN uses the run's ``kernels.bn_apply`` (``kernels``: the model's
    :class:`kernels.Kernels`; a fresh ``fused`` one when None) with the running statistics.
    """

    def __init__(self, cudnn, xp, precision: str = "fp32", kernels=None):
        from .kernels import Kernels  # noqa: PLC0415
        self.cudnn, self.xp, self.precision = cudnn, xp, precision
        self.kernels = kernels if kernels is not None else Kernels()
        self.handle = cudnn.create_handle()
        self.cache = GraphCache()
        self.io_dtype = _io_dtype(xp, precision)
        self._ws = xp.empty(1, dtype=xp.uint8)
        self._scalars = {}
        self._stream = None              # the stream the handle was last told (set_stream)

    def close(self) -> None:
        """Destroys the engine's cuDNN handle (once) and drops its graphs: a model that replaces its
        engine (``ResNet.set_engine``) or a check done with one releases it, instead of leaving one
        handle per engine made until the process ends."""
        if self.handle is not None:
            self.cudnn.destroy_handle(self.handle)
            self.handle = None
            self.cache = GraphCache()

    def _host_scalars(self, eps: float, momentum: float) -> tuple[int, int]:
        """BN's pass-by-value epsilon and momentum, as the host addresses of float32 values this
        engine keeps alive: a pass-by-value operand of cuDNN's variant pack is a host pointer, and
        an address is what every Frontend takes for an operand.  A NumPy array there was refused by
        cudnn-frontend 1.32 on an H200 ("NumPy only supports stream=None": it asks any array without
        a device pointer for a DLPack capsule with stream=-1), which failed every BN graph."""
        key = (float(eps), float(momentum))
        if key not in self._scalars:
            self._scalars[key] = tuple(np.full((1, 1, 1, 1), v, np.float32) for v in key)
        return tuple(int(a.ctypes.data) for a in self._scalars[key])

    def _run(self, built: Built, pack: dict):
        if self._ws.size < built.workspace:
            self._ws = self.xp.empty(built.workspace, dtype=self.xp.uint8)
        stream = self.xp.cuda.get_current_stream().ptr
        if stream != self._stream:       # the handle keeps its stream: told again only on a change
            self.cudnn.set_stream(handle=self.handle, stream=stream)
            self._stream = stream
        # the Frontend declares 16-byte aligned operands; BN's per-channel vectors are views into
        # the flat buffers at 4-byte offsets whenever a width is not a multiple of 4 (--width 0.3:
        # 5, 10, 19 channels): those run on aligned copies, copied back afterwards
        moved = {k: v for k, v in pack.items() if not isinstance(v, int) and _address(v) % ALIGN}
        run = {**pack, **{k: self.xp.array(v, copy=True) for k, v in moved.items()}}
        # every operand as its address (an int goes straight through; an array would become a
        # DLPack capsule per operand per call, about 265 a ResNet-50 step); ``run`` keeps the
        # arrays alive until execute returns
        built.graph.execute({built.tensors[k]: v if isinstance(v, int) else _address(v)
                             for k, v in run.items()}, self._ws)
        for k, v in moved.items():
            v[...] = run[k]

    def _conv(self, op, x_shape, w_shape, stride, pad):
        key = graph_key(op, x_shape, w_shape, stride, pad, self.precision)
        if op == "wgrad":
            return self.cache.get(key, lambda: build_wgrad(self.cudnn, self.handle, x_shape, w_shape,
                                                           stride, pad, self.precision))
        return self.cache.get(key, lambda: build_conv(self.cudnn, self.handle, op, x_shape, w_shape,
                                                      stride, pad, self.precision))

    def conv_forward(self, mod, x, train: bool):
        xp, w = self.xp, mod.w
        # the KRSC shadow of the LIVE weights, in every forward: an evaluation may follow an update
        # or a model loaded into the buffers (EASGD center, gossip average, resume), and a copy kept
        # from the last training forward would be stale (one transpose per conv: ~param bytes)
        mod._krsc = xp.ascontiguousarray(w.transpose(3, 0, 1, 2)).astype(self.io_dtype, copy=False)
        x = xp.ascontiguousarray(x, dtype=self.io_dtype)
        n, h, wd, _ = x.shape
        ho, wo = out_hw(h, wd, w.shape[0], w.shape[1], mod.stride, mod.pad)
        y = xp.empty((n, ho, wo, w.shape[3]), dtype=self.io_dtype)
        self._run(self._conv("fprop", x.shape, w.shape, mod.stride, mod.pad),
                  {"X": x, "W": mod._krsc, "Y": y})
        return y, (x, mod._krsc, w.shape)

    def conv_backward(self, mod, dout, cache, need_dx: bool):
        xp = self.xp
        x, krsc, w_shape = cache
        dout = xp.ascontiguousarray(dout, dtype=self.io_dtype)
        r, s, c, k = w_shape
        built = self._conv("wgrad", x.shape, w_shape, mod.stride, mod.pad)
        dw_krsc = xp.empty((k, r, s, c), dtype=xp.float32 if built.out_type == "FLOAT" else self.io_dtype)
        self._run(built, {"X": x, "DY": dout, "DW": dw_krsc})
        mod.dw[...] = dw_krsc.transpose(1, 2, 3, 0)          # (bf16 DW: cast into the float32 view)
        if not need_dx:
            return None
        dx = xp.empty(x.shape, dtype=self.io_dtype)
        self._run(self._conv("dgrad", x.shape, w_shape, mod.stride, mod.pad),
                  {"DY": dout, "W": krsc, "DX": dx})
        return dx

    def bn_forward(self, mod, x, train: bool, momentum: float = 0.1, eps: float = 1e-5):
        xp = self.xp
        if not train:
            scale = mod.gamma / xp.sqrt(mod.rvar + eps)
            return self.kernels.bn_apply(x, scale, mod.beta - mod.rmean * scale, mod.relu), None
        built = self.cache.get(("bn_fwd", x.shape, self.precision),
                               lambda: build_bn(self.cudnn, self.handle, "fwd", x.shape, self.precision))
        # the graph declares X in the I/O type: a float32 X under bf16 would be read as bf16 bits
        # (cudnn-frontend 1.32 describes a slot from the declaration); the model's X already is
        x = xp.ascontiguousarray(x, dtype=self.io_dtype)
        c = x.shape[-1]
        y = xp.empty(x.shape, dtype=self.io_dtype)
        mean, invstd = xp.empty(c, xp.float32), xp.empty(c, xp.float32)
        hp = self._host_scalars(eps, momentum)
        self._run(built, {"X": x, "scale": mod.gamma, "bias": mod.beta, "rmean": mod.rmean,
                          "rvar": mod.rvar, "eps": hp[0], "mom": hp[1], "Y": y, "mean": mean,
                          "invstd": invstd, "rmean_out": mod.rmean, "rvar_out": mod.rvar})
        if mod.relu:
            xp.maximum(y, 0, out=y)
        return y, (x, mean, invstd, y if mod.relu else None)

    def bn_backward(self, mod, dout, cache):
        xp = self.xp
        x, mean, invstd, relu_out = cache
        if relu_out is not None:
            xp.multiply(dout, relu_out > 0, out=dout)
        built = self.cache.get(("bn_bwd", x.shape, self.precision),
                               lambda: build_bn(self.cudnn, self.handle, "bwd", x.shape, self.precision))
        dx = xp.empty(x.shape, dtype=self.io_dtype)
        self._run(built, {"X": x, "DY": xp.ascontiguousarray(dout, dtype=self.io_dtype),
                          "scale": mod.gamma, "mean": mean, "invstd": invstd, "DX": dx,
                          "DS": mod.dgamma, "DB": mod.dbeta})
        return dx


ALIGN = 16                    # bytes: the alignment cuDNN Frontend tensors declare


def _address(a) -> int:
    """Device (CuPy: ``data.ptr``) or host (NumPy: ``ctypes.data``) address of an array's first element."""
    ptr = getattr(a.data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def _io_dtype(xp, precision: str):
    """CuPy dtype of activations: float32, or bf16 (ml_dtypes' bfloat16 when CuPy knows it)."""
    if precision != "bf16":
        return xp.float32
    import ml_dtypes  # noqa: PLC0415 - shipped with JAX/PyTorch images; CuPy 14 accepts it
    return ml_dtypes.bfloat16


def resolve(conv_impl: str, backend, dtype: str = "float32") -> tuple[str, str]:
    """Resolves ``model.conv_impl`` on this backend (probing cuDNN Frontend only on a GPU)."""
    have_gpu = bool(getattr(backend, "is_gpu", False))
    cudnn = probe_cudnn() if have_gpu and conv_impl != "im2col" else None
    return choose_conv_impl(conv_impl, have_gpu, cudnn is not None, have_gpu, dtype)


def attach(model, conv_impl: str, precision: str, backend, dtype: str = "float32"):
    """Selects the conv path for ``model`` (logged once); returns the engine or None (im2col)."""
    impl, why = resolve(conv_impl, backend, dtype)
    log.info("convolutions: %s (%s); precision %s", impl, why, precision)
    if impl != "cudnn":
        return None
    engine = CudnnEngine(probe_cudnn(), backend.xp, precision, model.kernels)
    model.set_engine(engine)
    return engine

