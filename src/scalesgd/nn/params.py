"""ONE flat buffer per kind of state, with named reshaped views into it.

``ParamSet`` owns three contiguous 1-D arrays of the same dtype:

- ``params``  every trainable tensor, in model order (stem first, classifier last);
- ``grads``   the same layout, written in place by backward;
- ``buffers`` non-trainable state (BatchNorm running mean/var), its own layout.

(Momentum lives in the optimizer as one more array of the ``params`` layout.)  Layers hold the views
``p[name]`` / ``g[name]`` / ``b[name]``; every exchange (one all-reduce, one RMA window, one server
message, one checkpoint dataset) operates on the flat arrays with no per-tensor copies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INITS = ("kaiming_fan_out", "linear_uniform", "ones", "zeros")


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor: shape, how to initialise it, whether weight decay applies to it."""

    name: str
    shape: tuple[int, ...]
    init: str = "zeros"
    decay: bool = True
    fan_in: int = 0             # for linear_uniform

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Layout:
    """Offsets of named tensors inside one flat array (computed once, shared by all replicas)."""

    def __init__(self, specs: list[TensorSpec]):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate tensor names: {dup}")
        self.specs = list(specs)
        self.offsets: dict[str, tuple[int, int]] = {}
        off = 0
        for s in specs:
            self.offsets[s.name] = (off, off + s.size)
            off += s.size
        self.size = off

    def views(self, flat) -> dict:
        """name -> reshaped view of ``flat`` (aliases it: writes through the view hit ``flat``)."""
        assert flat.shape == (self.size,), (flat.shape, self.size)
        return {s.name: flat[slice(*self.offsets[s.name])].reshape(s.shape) for s in self.specs}


def _init_host(spec: TensorSpec, rng: np.random.Generator, dtype) -> np.ndarray:
    if spec.init == "zeros":
        return np.zeros(spec.shape, dtype)
    if spec.init == "ones":
        return np.ones(spec.shape, dtype)
    if spec.init == "kaiming_fan_out":      # He normal, fan_out mode, gain sqrt(2) (torchvision ResNet)
        kh, kw, _, f = spec.shape
        std = math.sqrt(2.0 / (kh * kw * f))
        return (rng.standard_normal(spec.shape) * std).astype(dtype)
    if spec.init == "linear_uniform":       # PyTorch nn.Linear default: U(-1/sqrt(fan_in), +)
        bound = 1.0 / math.sqrt(spec.fan_in)
        return rng.uniform(-bound, bound, spec.shape).astype(dtype)
    raise ValueError(f"unknown init {spec.init!r} for {spec.name}")


class ParamSet:
    """Flat params/grads/buffers for one model replica on one device (``xp`` = numpy or cupy)."""

    def __init__(self, param_specs: list[TensorSpec], buffer_specs: list[TensorSpec], xp, dtype):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.layout = Layout(param_specs)
        self.buffer_layout = Layout(buffer_specs)
        self.params = xp.zeros(self.layout.size, dtype=self.dtype)
        self.grads = xp.zeros(self.layout.size, dtype=self.dtype)
        self.buffers = xp.zeros(self.buffer_layout.size, dtype=self.dtype)
        self.p = self.layout.views(self.params)
        self.g = self.layout.views(self.grads)
        self.b = self.buffer_layout.views(self.buffers)

    @property
    def num_params(self) -> int:
        return self.layout.size

    def initialize(self, seed: int) -> None:
        """Fills params and buffers from one seed: identical on every rank and every device.

        Values are drawn on the host in layout order, then copied once to the device.
        """
        rng = np.random.default_rng(seed)
        host = np.concatenate([_init_host(s, rng, self.dtype).ravel() for s in self.layout.specs])
        self.params[...] = self.xp.asarray(host)
        bhost = [_init_host(s, rng, self.dtype).ravel() for s in self.buffer_layout.specs]
        if bhost:
            self.buffers[...] = self.xp.asarray(np.concatenate(bhost))

    def decay_mask(self):
        """Flat 0/1 array of the params layout: 1 where weight decay applies (``optim.SGD`` needs it
        unless ``decay_bn_and_bias``)."""
        specs = self.layout.specs
        host = np.concatenate([np.full(s.size, 1.0 if s.decay else 0.0, self.dtype) for s in specs])
        return self.xp.asarray(host)
