"""A CPU stand-in for the cuDNN Frontend Python API (the ``cudnn`` module), for the calls
``nn/cudnn_conv.py`` makes, with the **real signatures**: every method takes exactly the parameter
names and defaults of the pybind11 bindings of cudnn-frontend 1.x (``python/pygraph/pygraph.cpp``,
``python/pygraph/norm.cpp``, ``python/properties.cpp`` and the ``tensor`` wrapper of
``python/cudnn/__init__.py``; the names have not changed from v1.0.0 to v1.22), so a wrong keyword
raises ``TypeError`` here as it does there.  No ``**kw`` swallows an argument.

The graph records the calls in order (``calls``), and ``execute`` computes the graph's one operation
with NumPy references (direct convolution; batch norm with biased variance for the normalisation
and unbiased for the running variance, as cuDNN does), writing into the arrays of the variant pack,
so the real ``CudnnEngine`` runs on NumPy arrays end to end.  Plan-level behaviour (heuristics,
support, numerical notes) is recorded, not modelled: ``deselect_numeric_notes`` only says that it
was called, and when (it filters the plans that ``create_execution_plans`` made).
"""
from __future__ import annotations

import ctypes
import types

import numpy as np

NOT_SET = "NOT_SET"
data_type = types.SimpleNamespace(NOT_SET=NOT_SET, FLOAT="FLOAT", HALF="HALF", BFLOAT16="BFLOAT16",
                                  DOUBLE="DOUBLE", INT32="INT32", INT64="INT64")
heur_mode = types.SimpleNamespace(A="A", B="B", FALLBACK="FALLBACK")
numerical_note = types.SimpleNamespace(TENSOR_CORE="TENSOR_CORE", DOWN_CONVERT_INPUTS="DOWN_CONVERT_INPUTS",
                                       REDUCED_PRECISION_REDUCTION="REDUCED_PRECISION_REDUCTION",
                                       FFT="FFT", NONDETERMINISTIC="NONDETERMINISTIC",
                                       WINOGRAD="WINOGRAD", STRICT_NAN_PROP="STRICT_NAN_PROP")
convolution_mode = types.SimpleNamespace(CROSS_CORRELATION="CROSS_CORRELATION", CONVOLUTION="CONVOLUTION")
tensor_reordering = types.SimpleNamespace(NONE="NONE")
try:                                    # bf16 arrays: ml_dtypes' where installed; the CPU tests
    import ml_dtypes                    # stand float16 in for them (NumPy has no bfloat16)
    _BF16 = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
except ImportError:
    _BF16 = (np.dtype(np.float16),)
DTYPES = {"FLOAT": (np.dtype(np.float32),), "HALF": (np.dtype(np.float16),), "BFLOAT16": _BF16,
          "DOUBLE": (np.dtype(np.float64),), "INT32": (np.dtype(np.int32),), "INT64": (np.dtype(np.int64),)}
handles = {"created": 0, "streams": 0, "destroyed": 0}
# what ``execute`` was handed: operands as arrays (each a DLPack capsule in the real Frontend, made
# per operand and per call) or as addresses (ints, taken as they are)
operands = {"arrays": 0, "addresses": 0, "executes": 0}


class cudnnGraphNotSupportedError(RuntimeError):  # noqa: N801 - the bindings' name
    """What ``check_support`` raises when no engine supports a graph."""


def create_handle():
    handles["created"] += 1
    return handles["created"]


def set_stream(handle, stream):
    if handle is None:
        raise RuntimeError("cudnn stand-in: set_stream on a destroyed handle")
    handles["streams"] += 1


def destroy_handle(handle):
    if handle is None:
        raise RuntimeError("cudnn stand-in: destroy_handle(None)")
    handles["destroyed"] += 1


class Tensor:
    def __init__(self, dim=None, stride=None, data_type=NOT_SET, is_pass_by_value=False, name=""):
        self.dim, self.stride, self.data_type = dim, stride, data_type
        self.is_pass_by_value, self.name, self.is_output = is_pass_by_value, name, False

    def set_output(self, is_output):
        self.is_output = bool(is_output)
        return self

    def set_data_type(self, data_type=NOT_SET):
        self.data_type = data_type
        return self

    def set_dim(self, value):
        self.dim = list(value)
        return self

    def set_stride(self, value):
        self.stride = list(value)
        return self

    def set_name(self, value):
        self.name = value
        return self


class pygraph:  # noqa: N801 - the module's own name
    no_engine = None            # module(no_engine=...): which graphs no engine supports

    def __init__(self, name="test_graph", io_data_type=NOT_SET, intermediate_data_type=NOT_SET,
                 compute_data_type=NOT_SET, handle=None, sm_count=None, sm_version=None,
                 kernel_cache=None, device_property=None, is_dynamic_shape_enabled=False,
                 is_override_shape_enabled=False):
        self.io_data_type, self.compute_data_type = io_data_type, compute_data_type
        self.calls: list = []
        self.op = None

    # ---- tensors and operations (names and defaults of the bindings)
    def tensor(self, dim, stride, data_type=NOT_SET, is_virtual=False, is_pass_by_value=False,
               ragged_offset=None, reordering_type=tensor_reordering.NONE, name="", uid=-1):
        return Tensor(list(dim), list(stride), data_type, is_pass_by_value, name)

    def _record(self, kind, args, outs):
        assert self.op is None, "the stand-in computes graphs of one operation"
        self.op = (kind, args, outs)
        self.calls.append((kind, dict(args)))
        return outs[0] if len(outs) == 1 else outs

    def conv_fprop(self, image, weight, padding=(), stride=(), dilation=(),
                   convolution_mode=convolution_mode.CROSS_CORRELATION, compute_data_type=NOT_SET,
                   name=""):
        return self._record("conv_fprop", dict(image=image, weight=weight, padding=list(padding),
                                               stride=list(stride), dilation=list(dilation),
                                               compute_data_type=compute_data_type), [Tensor()])

    def conv_dgrad(self, loss, filter, padding=(), stride=(), dilation=(),  # noqa: A002 - binding name
                   convolution_mode=convolution_mode.CROSS_CORRELATION, compute_data_type=NOT_SET,
                   name=""):
        return self._record("conv_dgrad", dict(loss=loss, filter=filter, padding=list(padding),
                                               stride=list(stride), dilation=list(dilation),
                                               compute_data_type=compute_data_type), [Tensor()])

    def conv_wgrad(self, image, loss, padding=(), stride=(), dilation=(),
                   convolution_mode=convolution_mode.CROSS_CORRELATION, compute_data_type=NOT_SET,
                   name=""):
        return self._record("conv_wgrad", dict(image=image, loss=loss, padding=list(padding),
                                               stride=list(stride), dilation=list(dilation),
                                               compute_data_type=compute_data_type), [Tensor()])

    def batchnorm(self, input, scale, bias, in_running_mean, in_running_var, epsilon, momentum,  # noqa: A002
                  peer_stats=(), compute_data_type=NOT_SET, name=""):
        return self._record("batchnorm", dict(input=input, scale=scale, bias=bias, rmean=in_running_mean,
                                              rvar=in_running_var, epsilon=epsilon, momentum=momentum),
                            [Tensor() for _ in range(5)])

    def batchnorm_backward(self, grad, input, scale, mean, inv_variance, peer_stats=(),  # noqa: A002
                           compute_data_type=NOT_SET, name=""):
        return self._record("batchnorm_backward", dict(grad=grad, input=input, scale=scale, mean=mean,
                                                       inv_variance=inv_variance),
                            [Tensor() for _ in range(3)])

    # ---- the build sequence
    def validate(self):
        self.calls.append(("validate", {}))

    def build_operation_graph(self):
        self.calls.append(("build_operation_graph", {}))

    def create_execution_plans(self, modes):
        self.calls.append(("create_execution_plans", {"modes": list(modes)}))

    def deselect_numeric_notes(self, notes):
        self.calls.append(("deselect_numeric_notes", {"notes": list(notes)}))

    def check_support(self):
        self.calls.append(("check_support", {}))
        why = type(self).no_engine(self) if type(self).no_engine else None
        if why:
            raise cudnnGraphNotSupportedError(
                f"[cudnn_frontend] Error: No execution plans support the graph. ({why})")

    def build_plans(self, policy=None):
        self.calls.append(("build_plans", {}))

    def get_workspace_size(self):
        return 0

    # ---- execution: the one operation, by NumPy references
    def declared_type(self, t) -> str:
        """A tensor's data type: its own, else the graph's I/O type (an output left unset)."""
        return t.data_type if t.data_type != NOT_SET else self.io_data_type

    def check_operand(self, t, a) -> None:
        """What cuDNN takes on trust from a device pointer, checked here against the declaration:
        the array's dtype is the declared data type's, it holds exactly the elements the declared
        dims address through the declared strides, and it is one dense block (the Frontend reads the
        pointer, never the array's own strides).  The lax stand-in before took a float32 array in a
        BFLOAT16 slot: the class of the bf16 BN defect that the H200 found."""
        arr = np.asarray(a)
        want = self.declared_type(t)
        if arr.dtype not in DTYPES.get(want, ()):
            raise RuntimeError(f"cudnn stand-in: tensor {t.name!r} is declared {want} but handed a "
                               f"{arr.dtype} array")
        if t.dim is not None:
            n = int(np.prod(t.dim))
            if arr.size != n:
                raise RuntimeError(f"cudnn stand-in: tensor {t.name!r} declares dims {t.dim} ({n} elements) "
                                   f"but is handed {arr.size}")
            if t.stride is not None and sum((d - 1) * st for d, st in zip(t.dim, t.stride)) + 1 != n:
                raise RuntimeError(f"cudnn stand-in: tensor {t.name!r}: strides {t.stride} of dims {t.dim} "
                                   f"do not address {n} elements densely")
        if not arr.flags.c_contiguous:
            raise RuntimeError(f"cudnn stand-in: tensor {t.name!r} is handed a strided view, not a dense "
                               "block (the Frontend reads the pointer with the declared strides)")

    def dims_of(self, t) -> tuple[list, list]:
        """(dims, strides) of ``t``: declared, or, for an output the Frontend shapes itself,
        inferred from the operation's inputs as cuDNN does (NHWC, KRSC, per-channel vectors)."""
        if t.dim is not None:
            return t.dim, t.stride
        kind, args, outs = self.op
        if kind == "conv_fprop" and t is outs[0]:
            (n, _, h, w), (k, _, r, s_) = args["image"].dim, args["weight"].dim
            (pad, _), (st, _) = args["padding"], args["stride"]
            ho, wo = (h + 2 * pad - r) // st + 1, (w + 2 * pad - s_) // st + 1
            return [n, k, ho, wo], [ho * wo * k, 1, wo * k, k]
        like = args["input"] if t is outs[0] else args["scale"]     # BN: Y / DX, or a vector
        return like.dim, like.stride

    def view_of(self, t, ptr: int) -> np.ndarray:
        """The memory at ``ptr`` read as cuDNN reads it: the declared data type over the dims and
        strides (declared or inferred), physical order by descending stride."""
        dims, strides = self.dims_of(t)
        dtype = DTYPES[self.declared_type(t)][0]
        order = sorted(range(len(dims)), key=lambda i: -strides[i])
        shape = [dims[i] for i in order]
        n = int(np.prod(shape))
        return np.ndarray(shape, dtype, buffer=(ctypes.c_char * (n * dtype.itemsize)).from_address(ptr))

    def execute(self, variant_pack, workspace, handle=None):
        kind, args, outs = self.op
        operands["executes"] += 1
        for t, a in variant_pack.items():        # the Frontend declares 16-byte aligned tensors
            if t.is_pass_by_value:
                # a host address (int), as the engine passes it: cudnn-frontend 1.32 refused a
                # NumPy array there ("NumPy only supports stream=None"; measured on an H200)
                if type(a) is not int:
                    raise ValueError(f"cudnn stand-in: pass-by-value {t.name!r} is a {type(a).__name__}, "
                                     "not a host address: NumPy only supports stream=None.")
                continue
            if isinstance(a, int):                # a device address: read through the declaration
                operands["addresses"] += 1
                if a % 16:
                    raise RuntimeError(f"cudnn stand-in: tensor {t.name!r} is not 16-byte aligned")
                continue
            operands["arrays"] += 1
            if np.asarray(a).ctypes.data % 16:
                raise RuntimeError(f"cudnn stand-in: tensor {t.name!r} is not 16-byte aligned")
            self.check_operand(t, a)
        pack = {id(t): np.array([ctypes.c_float.from_address(a).value], np.float32) if t.is_pass_by_value
                else self.view_of(t, a) if isinstance(a, int) else np.asarray(a)
                for t, a in variant_pack.items()}
        get = lambda t: pack[id(t)]                                    # noqa: E731
        if kind.startswith("conv_"):
            (ph, pw), (sh, sw) = args["padding"], args["stride"]
            assert ph == pw and sh == sw and args["dilation"] == [1, 1]
            _conv(kind, args, outs[0], get, ph, sh)
        elif kind == "batchnorm":
            x = get(args["input"]).astype(np.float64)
            eps, mom = float(get(args["epsilon"]).ravel()[0]), float(get(args["momentum"]).ravel()[0])
            axes = tuple(range(x.ndim - 1))
            mean, var = x.mean(axis=axes), x.var(axis=axes)
            n = x.size // x.shape[-1]
            invstd = 1.0 / np.sqrt(var + eps)
            y, m, iv, rm, rv = (get(t) for t in outs)
            y[...] = (x - mean) * invstd * get(args["scale"]) + get(args["bias"])
            rmean, rvar = get(args["rmean"]).copy(), get(args["rvar"]).copy()
            m[...], iv[...] = mean, invstd
            rm[...] = (1 - mom) * rmean + mom * mean
            rv[...] = (1 - mom) * rvar + mom * var * n / max(n - 1, 1)
        elif kind == "batchnorm_backward":
            x, dy = get(args["input"]).astype(np.float64), get(args["grad"]).astype(np.float64)
            mean, invstd = get(args["mean"]), get(args["inv_variance"])
            axes = tuple(range(x.ndim - 1))
            xhat = (x - mean) * invstd
            dbeta, dgamma = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
            n = x.size // x.shape[-1]
            dx, ds, db = (get(t) for t in outs)
            dx[...] = get(args["scale"]) * invstd / n * (n * dy - dbeta - xhat * dgamma)
            ds[...], db[...] = dgamma, dbeta
        else:
            raise AssertionError(kind)


def _conv(kind, args, out, get, pad, stride):
    """NHWC activations, KRSC filters (what the engine hands the graph); float64 arithmetic."""
    if kind == "conv_fprop":
        x, w = get(args["image"]).astype(np.float64), get(args["weight"]).astype(np.float64)
        k, r, s, _ = w.shape
        xp_ = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        win = np.lib.stride_tricks.sliding_window_view(xp_, (r, s), axis=(1, 2))[:, ::stride, ::stride]
        get(out)[...] = np.einsum("nhwcrs,krsc->nhwk", win, w, optimize=True)
        return
    if kind == "conv_dgrad":
        dy, w = get(args["loss"]).astype(np.float64), get(args["filter"]).astype(np.float64)
        dx = get(out)
        n, h, wd, c = dx.shape
        k, r, s, _ = w.shape
        acc = np.zeros((n, h + 2 * pad + stride, wd + 2 * pad + stride, c))
        ho, wo = dy.shape[1:3]
        for i in range(r):
            for j in range(s):
                acc[:, i:i + stride * ho:stride, j:j + stride * wo:stride, :] += dy @ w[:, i, j, :]
        dx[...] = acc[:, pad:pad + h, pad:pad + wd, :]
        return
    x, dy = get(args["image"]).astype(np.float64), get(args["loss"]).astype(np.float64)
    dw = get(out)                                             # (K, R, S, C)
    _, r, s, _ = dw.shape
    xp_ = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(xp_, (r, s), axis=(1, 2))[:, ::stride, ::stride]
    win = win[:, :dy.shape[1], :dy.shape[2]]
    dw[...] = np.einsum("nhwcrs,nhwk->krsc", win, dy, optimize=True)


class HostXP:
    """NumPy with the ``cuda.get_current_stream().ptr`` that ``CudnnEngine._run`` reads."""

    cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0))

    def __getattr__(self, name):
        return getattr(np, name)


def module(no_engine=None):
    """A fresh stand-in ``cudnn`` module (its handle counters reset).  ``no_engine(graph)``: a
    reason when no engine supports ``graph`` (its ``op``: (kind, arguments, outputs), and its
    ``io_data_type``), so ``check_support`` raises ``cudnnGraphNotSupportedError`` as the bindings
    do; plan support is otherwise not modelled (every graph is supported)."""
    handles.update(created=0, streams=0, destroyed=0)
    operands.update(arrays=0, addresses=0, executes=0)
    graph = pygraph if no_engine is None else \
        type("pygraph", (pygraph,), {"no_engine": staticmethod(no_engine)})
    return types.SimpleNamespace(pygraph=graph, data_type=data_type, heur_mode=heur_mode,
                                 numerical_note=numerical_note, convolution_mode=convolution_mode,
                                 create_handle=create_handle, set_stream=set_stream,
                                 destroy_handle=destroy_handle,
                                 cudnnGraphNotSupportedError=cudnnGraphNotSupportedError)


def wgrad_dw_type(graph) -> str | None:
    """DW's data type of a wgrad graph, None for another graph (for ``no_engine`` rules)."""
    return graph.op[2][0].data_type if graph.op and graph.op[0] == "conv_wgrad" else None
