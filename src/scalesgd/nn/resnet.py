"""ResNets built from the forward/backward pairs of :mod:`layers`, on one flat ParamSet.

- ImageNet stem (7x7/2 conv, BN, ReLU, 3x3/2 max-pool): ResNet-18/34 (basic blocks), ResNet-50
  (bottleneck, expansion 4, stride on the 3x3 conv as in torchvision).
- CIFAR stem (3x3/1 conv, BN, ReLU): ResNet-8/20/32/56 (basic blocks, widths 16/32/64).
- Shortcuts are identity when shapes match, else a projection (1x1 conv with the block's stride + BN).
- ``width``: multiplier on every stage width (and the stem); ``num_classes``: any.

A module is a small object with ``specs()`` (the tensors it owns), ``bind(ps)`` (take views into a
ParamSet), ``forward(x, train) -> (out, cache)`` and ``backward(dout, cache) -> dx``.  Backward runs
in exact reverse order of forward.  Activations are NHWC: ``x: (N, H, W, 3)``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..backend import get_array_module
from ..choices import CONV_ALGOS
from . import conv as CV
from . import kernels as K
from . import layers as L
from .params import ParamSet, TensorSpec


@dataclass(frozen=True)
class Arch:
    stem: str                   # "imagenet" | "cifar"
    block: str                  # "basic" | "bottleneck"
    stages: tuple[int, ...]     # blocks per stage
    widths: tuple[int, ...]     # base width of each stage


ARCHS = {
    "resnet18": Arch("imagenet", "basic", (2, 2, 2, 2), (64, 128, 256, 512)),
    "resnet34": Arch("imagenet", "basic", (3, 4, 6, 3), (64, 128, 256, 512)),
    "resnet50": Arch("imagenet", "bottleneck", (3, 4, 6, 3), (64, 128, 256, 512)),
    "resnet101": Arch("imagenet", "bottleneck", (3, 4, 23, 3), (64, 128, 256, 512)),
    "resnet152": Arch("imagenet", "bottleneck", (3, 8, 36, 3), (64, 128, 256, 512)),
    "resnet8": Arch("cifar", "basic", (1, 1, 1), (16, 32, 64)),     # the smallest of He et al.'s 6n+2
    "resnet20": Arch("cifar", "basic", (3, 3, 3), (16, 32, 64)),
    "resnet32": Arch("cifar", "basic", (5, 5, 5), (16, 32, 64)),
    "resnet56": Arch("cifar", "basic", (9, 9, 9), (16, 32, 64)),
}


class ParamModule:
    """A leaf that owns tensors; after its backward it reports them final (``grad_hook``), which is
    how a bucketed all-reduce starts communicating while backward is still running."""

    grad_hook = None
    param_names: tuple = ()
    engine = None                # a cudnn_conv.CudnnEngine on the GPU's cuDNN path, else None

    def _grads_done(self):
        if self.grad_hook is not None:
            self.grad_hook(self.param_names)


class Conv(ParamModule):
    def __init__(self, name: str, cin: int, cout: int, k: int, stride: int = 1, need_dx: bool = True):
        self.name, self.cin, self.cout, self.k, self.stride = name, cin, cout, k, stride
        self.pad = k // 2
        self.need_dx = need_dx       # False for the stem: no gradient w.r.t. the images
        self.ws = CV.Workspace()     # im2col buffers reused every step
        self.algo = "auto"           # choices.CONV_ALGOS (the ResNet's conv_algo)
        self._plan, self._plan_key = None, None   # conv.conv_plan for the last (shape, dtype) seen

    def specs(self):
        return [TensorSpec(f"{self.name}.weight", (self.k, self.k, self.cin, self.cout),
                           "kaiming_fan_out", decay=True)], []

    def bind(self, ps: ParamSet):
        self.w, self.dw = ps.p[f"{self.name}.weight"], ps.g[f"{self.name}.weight"]

    def trace(self, shape, visit):
        visit(self, shape)
        return (shape[0], _out(shape[1], self.k, self.stride, self.pad),
                _out(shape[2], self.k, self.stride, self.pad), self.cout)

    def forward(self, x, train):
        if self.engine is not None:
            return self.engine.conv_forward(self, x, train)
        key = (x.shape, x.dtype)
        if key != self._plan_key:                # the plan depends on the batch shape only
            self._plan = CV.conv_plan(self.algo, get_array_module(x), x.shape, self.k, self.k,
                                     self.stride, self.pad, x.dtype.itemsize, self.cout)
            self._plan_key = key
        return CV.conv2d_forward(x, self.w, self.stride, self.pad, self.ws, self._plan)

    def backward(self, dout, cache):
        if self.engine is not None:
            dx = self.engine.conv_backward(self, dout, cache, self.need_dx)
        else:
            dx = CV.conv2d_backward(dout, cache, self.dw, need_dx=self.need_dx, ws=self.ws)
        self._grads_done()
        return dx


class BatchNorm(ParamModule):
    """BatchNorm2d over NHWC channels, optionally followed by ReLU (applied in place)."""

    def __init__(self, name: str, c: int, relu: bool, zero_gamma: bool = False):
        self.name, self.c, self.relu, self.zero_gamma = name, c, relu, zero_gamma

    def specs(self):
        n = self.name
        params = [TensorSpec(f"{n}.weight", (self.c,), "zeros" if self.zero_gamma else "ones", decay=False),
                  TensorSpec(f"{n}.bias", (self.c,), "zeros", decay=False)]
        buffers = [TensorSpec(f"{n}.running_mean", (self.c,), "zeros"),
                   TensorSpec(f"{n}.running_var", (self.c,), "ones")]
        return params, buffers

    def bind(self, ps: ParamSet):
        n = self.name
        self.gamma, self.beta = ps.p[f"{n}.weight"], ps.p[f"{n}.bias"]
        self.dgamma, self.dbeta = ps.g[f"{n}.weight"], ps.g[f"{n}.bias"]
        self.rmean, self.rvar = ps.b[f"{n}.running_mean"], ps.b[f"{n}.running_var"]

    def trace(self, shape, visit):
        visit(self, shape)
        return shape

    def forward(self, x, train):
        if self.engine is not None:
            return self.engine.bn_forward(self, x, train)
        out, cache = L.batchnorm_forward(x, self.gamma, self.beta, self.rmean, self.rvar, train)
        if self.relu:
            out, _ = L.relu_forward(out, inplace=True)
        return out, (cache, out if self.relu else None)

    def backward(self, dout, cache):
        if self.engine is not None:
            dx = self.engine.bn_backward(self, dout, cache)
            self._grads_done()
            return dx
        bn_cache, relu_out = cache
        if relu_out is not None:
            dout = L.relu_backward(dout, relu_out)
        dx = L.batchnorm_backward(dout, bn_cache, self.dgamma, self.dbeta)
        self._grads_done()
        return dx


class Sequence:
    """Modules applied in order; backward in exact reverse order."""

    def __init__(self, *mods):
        self.mods = list(mods)

    def children(self):
        return self.mods

    def trace(self, shape, visit):
        """The output shape for an input of ``shape``; ``visit(leaf, its input shape)`` on the way."""
        for m in self.mods:
            shape = m.trace(shape, visit)
        return shape

    def forward(self, x, train):
        caches = []
        for m in self.mods:
            x, c = m.forward(x, train)
            caches.append(c)
        return x, caches

    def backward(self, dout, caches):
        for m, c in zip(reversed(self.mods), reversed(caches)):
            dout = m.backward(dout, c)
        return dout


class ResidualBlock:
    """out = relu(main(x) + shortcut(x)); main is conv-bn-relu-conv-bn (basic) or the 3-conv bottleneck."""

    def __init__(self, name: str, cin: int, width: int, stride: int, kind: str, zero_gamma: bool,
                 kernels: K.Kernels):
        self.kernels = kernels
        exp = 4 if kind == "bottleneck" else 1
        cout = width * exp
        if kind == "basic":
            self.main = Sequence(Conv(f"{name}.conv1", cin, width, 3, stride),
                                 BatchNorm(f"{name}.bn1", width, relu=True),
                                 Conv(f"{name}.conv2", width, width, 3, 1),
                                 BatchNorm(f"{name}.bn2", width, relu=False, zero_gamma=zero_gamma))
        else:
            self.main = Sequence(Conv(f"{name}.conv1", cin, width, 1, 1),
                                 BatchNorm(f"{name}.bn1", width, relu=True),
                                 Conv(f"{name}.conv2", width, width, 3, stride),
                                 BatchNorm(f"{name}.bn2", width, relu=True),
                                 Conv(f"{name}.conv3", width, cout, 1, 1),
                                 BatchNorm(f"{name}.bn3", cout, relu=False, zero_gamma=zero_gamma))
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = Sequence(Conv(f"{name}.downsample.0", cin, cout, 1, stride),
                                     BatchNorm(f"{name}.downsample.1", cout, relu=False))
        self.cout = cout

    def children(self):
        return [self.main] + ([self.shortcut] if self.shortcut else [])

    def trace(self, shape, visit):
        out = self.main.trace(shape, visit)
        if self.shortcut is not None:
            self.shortcut.trace(shape, visit)
        return out

    def forward(self, x, train):
        h, main_c = self.main.forward(x, train)       # h is a fresh array: safe to add into
        if self.shortcut is not None:
            s, sc_c = self.shortcut.forward(x, train)
        else:
            s, sc_c = x, None
        out = self.kernels.add_relu(h, s)              # h <- relu(h + s): one fused pass on GPU
        return out, (main_c, sc_c, out)

    def backward(self, dout, cache):
        main_c, sc_c, out = cache
        d = L.relu_backward(dout, out)
        dx = self.main.backward(d, main_c)             # leaves d intact (BN backward does not clobber)
        dx += self.shortcut.backward(d, sc_c) if self.shortcut is not None else d
        return dx


class Head(ParamModule):
    """Global average pool + linear classifier."""

    def __init__(self, cin: int, num_classes: int):
        self.cin, self.k = cin, num_classes

    def specs(self):
        return [TensorSpec("fc.weight", (self.cin, self.k), "linear_uniform", True, self.cin),
                TensorSpec("fc.bias", (self.k,), "linear_uniform", False, self.cin)], []

    def bind(self, ps: ParamSet):
        self.w, self.b = ps.p["fc.weight"], ps.p["fc.bias"]
        self.dw, self.db = ps.g["fc.weight"], ps.g["fc.bias"]

    def trace(self, shape, visit):
        visit(self, shape)
        return (shape[0], self.k)

    def forward(self, x, train):
        pooled, x_shape = L.avgpool_forward(x)
        logits, lc = L.linear_forward(pooled, self.w, self.b)
        return logits, (x_shape, lc)

    def backward(self, dout, cache):
        x_shape, lc = cache
        dpooled = L.linear_backward(dout, lc, self.dw, self.db)
        self._grads_done()
        return L.avgpool_backward(dpooled, x_shape)


class MaxPool:
    """3x3 max-pool, stride 2, pad 1 (the ImageNet stem)."""

    def trace(self, shape, visit):
        visit(self, shape)
        return (shape[0], _out(shape[1], 3, 2, 1), _out(shape[2], 3, 2, 1), shape[3])

    def forward(self, x, train):
        return L.maxpool_forward(x, 3, 2, 1)

    def backward(self, dout, cache):
        return L.maxpool_backward(dout, cache)


def _out(n: int, k: int, stride: int, pad: int) -> int:
    """Output size of a k-wide window with ``stride`` and ``pad`` over ``n``."""
    return (n + 2 * pad - k) // stride + 1


def _leaves(mod):
    if hasattr(mod, "children"):
        for c in mod.children():
            yield from _leaves(c)
    else:
        yield mod


class ResNet:
    """A whole ResNet bound to one ParamSet.  ``forward(x, train)``, ``backward(dlogits, cache)``.

    ``seed``: the parameters and BN buffers are initialised from it at construction, exactly as
    ``ps.initialize(seed)`` does (calling that again with the same seed changes nothing).  ``None``
    leaves every weight at zero, for a caller that loads or initialises them itself (it then costs
    nothing: ResNet-50's init takes ~0.5 s).  ``kernels``: the run's :class:`kernels.Kernels`
    (``model.kernels``; a fresh ``fused`` one when None), also what the optimizer and the cuDNN
    engine of the run use (``ResNet.kernels``)."""

    def __init__(self, name: str, num_classes: int = 1000, width: float = 1.0,
                 zero_init_residual: bool = False, xp=None, dtype="float32", seed: int | None = 0,
                 conv_algo: str = "auto", kernels: K.Kernels | None = None):
        if name not in ARCHS:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(ARCHS)}")
        if xp is None:
            import numpy as xp  # noqa: PLC0415
        arch = ARCHS[name]
        self.name, self.num_classes, self.width = name, num_classes, width
        self.kernels = kernels if kernels is not None else K.Kernels()
        widths = [max(1, round(w * width)) for w in arch.widths]
        stem_w = widths[0]
        if arch.stem == "imagenet":
            stem = [Conv("conv1", 3, stem_w, 7, 2, need_dx=False), BatchNorm("bn1", stem_w, relu=True),
                    MaxPool()]
        else:
            stem = [Conv("conv1", 3, stem_w, 3, 1, need_dx=False), BatchNorm("bn1", stem_w, relu=True)]
        blocks, cin = [], stem_w
        for si, (nblocks, w) in enumerate(zip(arch.stages, widths)):
            for bi in range(nblocks):
                stride = 2 if (bi == 0 and si > 0) else 1
                blk = ResidualBlock(f"layer{si + 1}.{bi}", cin, w, stride, arch.block, zero_init_residual,
                                    self.kernels)
                blocks.append(blk)
                cin = blk.cout
        self.net = Sequence(*stem, *blocks, Head(cin, num_classes))
        self.stem_conv = stem[0]
        pspecs, bspecs = [], []
        for m in _leaves(self.net):
            if hasattr(m, "specs"):
                p, b = m.specs()
                pspecs += p
                bspecs += b
        self.ps = ParamSet(pspecs, bspecs, xp, dtype)
        for m in _leaves(self.net):
            if isinstance(m, ParamModule):
                m.bind(self.ps)
                m.param_names = tuple(t.name for t in m.specs()[0])
        if seed is not None:
            self.ps.initialize(seed)
        self.set_conv_algo(conv_algo)

    @property
    def num_params(self) -> int:
        return self.ps.num_params

    def set_conv_algo(self, algo: str) -> None:
        """How every Conv runs on the xp path (``choices.CONV_ALGOS``, see :mod:`.conv`)."""
        if algo not in CONV_ALGOS:
            raise ValueError(f"conv algorithm {algo!r}: choose from {', '.join(CONV_ALGOS)}")
        for m in _leaves(self.net):
            if isinstance(m, Conv):
                m.algo, m._plan_key = algo, None

    def set_engine(self, engine) -> None:
        """Routes every Conv and BatchNorm through ``engine`` (cudnn_conv.CudnnEngine; None = xp);
        the engine it replaces is closed (its cuDNN handle destroyed)."""
        layers = [m for m in _leaves(self.net) if isinstance(m, (Conv, BatchNorm))]
        old = {id(m.engine): m.engine for m in layers if m.engine is not None and m.engine is not engine}
        for m in layers:
            m.engine = engine
        for e in old.values():                # (a layer's own fallback may have left the others one)
            e.close()

    def share_workspaces(self, other: "ResNet") -> None:
        """Every Conv reuses ``other``'s im2col buffers (same architecture): for replicas stepped one
        at a time in one process (the virtual cluster), so p replicas cost one set of buffers.  A
        cache stays checked (``Workspace.check``): a forward of another replica in between makes
        backward raise, never compute from its batch."""
        convs = [m for m in _leaves(other.net) if isinstance(m, Conv)]
        for mine, theirs in zip([m for m in _leaves(self.net) if isinstance(m, Conv)], convs, strict=True):
            mine.ws = theirs.ws

    def set_grad_hook(self, fn) -> None:
        """``fn(names)`` is called during backward as soon as the gradients of ``names`` are final."""
        for m in _leaves(self.net):
            if isinstance(m, ParamModule):
                m.grad_hook = fn

    @contextlib.contextmanager
    def grad_hook_off(self):
        """Inside, backward calls no gradient hook (a CUDA graph's capture: the hook's host calls,
        e.g. starting an all-reduce, cannot be recorded); afterwards each module's hook again."""
        mods = [m for m in _leaves(self.net) if isinstance(m, ParamModule)]
        saved = [m.grad_hook for m in mods]
        for m in mods:
            m.grad_hook = None
        try:
            yield
        finally:
            for m, fn in zip(mods, saved):
                m.grad_hook = fn

    def layer_inputs(self, n: int, hw: int) -> list[tuple[object, tuple]]:
        """(leaf module, the shape of its input) for a batch x: (n, hw, hw, 3), in forward order
        (a block's main branch, then its shortcut): the geometry of every layer without running
        one, e.g. for the start-up check's cuDNN graphs (fastpaths/)."""
        out: list = []
        self.net.trace((n, hw, hw, 3), lambda mod, shape: out.append((mod, shape)))
        return out

    def forward(self, x, train: bool):
        """x: (N, H, W, 3) -> logits (N, num_classes), cache for backward."""
        return self.net.forward(x, train)

    def backward(self, dlogits, cache, need_dx: bool = False):
        """Fills ``ps.grads``; returns dL/dx (N, H, W, 3) when need_dx (for gradient checks)."""
        self.stem_conv.need_dx = need_dx
        return self.net.backward(dlogits, cache)
