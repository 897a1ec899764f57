"""The training step's forward, loss and backward captured in a CUDA graph (``train.cuda_graph``).

A ResNet-50 step issues some 260 cuDNN executions and as many small kernels, each a Python call:
host time the GPU waits for (docs/gpu.md, the ~30 ms a step).  Captured once the batch's shapes are
fixed, the whole of it is one ``graph.launch``.  What is captured: ``train_step`` (forward, the loss,
backward into ``ps.grads``, the BN statistics' update), reading the batch from two static device
buffers and writing the loss and the error count into two static outputs.  What is not: the
gradient sum (MPI, or NCCL started from the host: the all-reduce's buckets then start after
backward, with no overlap) and the update (its learning rate changes every step).

``CapturedStep`` runs ``warmup`` steps eagerly at each new shape (kernels compiled, cuDNN plans
built, workspaces allocated at their final addresses), then captures on a side stream, with a
private memory pool that lives as long as the graph (a temporary of the captured step keeps its
address for every replay, and nothing else is ever given it: PyTorch's ``torch.cuda.graph`` keeps
a pool for the same reason).  ``invalidate`` drops the graph (the loop calls it after an evaluation,
which may have regrown a shared workspace); a new shape does too.

GPU only, and **never yet run on a GPU**: the CPU tests replay the step through a stand-in
(``capture`` is injectable: ``replay_on_host``) that checks the wiring (static inputs, outputs,
warm-up, hooks off while capturing, invalidation), not CUDA's semantics.  ``captured_matches_eager``
is the check a GPU run makes (the start-up check's ``cuda graph`` component, and
``benchmarks/gpu_check.sh``).
"""
from __future__ import annotations

import contextlib

import numpy as np

from .step import train_step

GRAPH_COMPONENT = "cuda graph of the training step"   # its name in the start-up check's report
OUTPUTS = ("loss", "grads", "bn_statistics")           # what the check compares, per batch


def cuda_capture(xp, fn):
    """Captures ``fn()`` on a side stream with a private memory pool; returns ``launch()``, which
    replays it on the stream current at the call (so it is ordered with the copies before it and
    the update after it), and the pool (kept alive with the graph)."""
    xp.cuda.get_current_stream().synchronize()    # the warm-up's cached blocks back to the device, so
    xp.get_default_memory_pool().free_all_blocks()   # the graph's pool never has to free its own
    stream = xp.cuda.Stream(non_blocking=True)     # (under pressure a pool frees every block it
    pool = xp.cuda.MemoryPool()                    # caches: captured addresses, mid-capture)
    with xp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            fn()
        except BaseException:
            try:                             # (end the capture, keep the step's own error)
                stream.end_capture()
            except Exception:  # noqa: BLE001
                pass
            raise
        graph = stream.end_capture()
    return (lambda: graph.launch(stream=xp.cuda.get_current_stream())), pool


def replay_on_host(model):
    """A stand-in for ``cuda_capture`` on NumPy (the GPU check's dry run, the CPU tests): capturing
    runs ``fn``'s host side once and puts the model's arrays back as they were (a capture runs no
    kernel); each launch runs ``fn`` again (a graph replays its kernels on the same buffers).  It
    checks the wiring, not CUDA's semantics."""
    def capture(xp, fn):
        ps = model.ps
        saved = [a.copy() for a in (ps.params, ps.grads, ps.buffers)]
        fn()
        for a, s in zip((ps.params, ps.grads, ps.buffers), saved):
            a[...] = s
        return fn, None
    return capture


class CapturedStep:
    """``step(x, y) -> (loss, errors)`` as ``train_step`` returns them (0-d device arrays: here,
    the static outputs the graph writes), eager for the first ``warmup`` calls at each shape."""

    def __init__(self, model, xp, label_smoothing: float = 0.0, grad_scale: float = 1.0,
                 warmup: int = 2, capture=cuda_capture):
        self.model, self.xp, self.capture = model, xp, capture
        self.label_smoothing, self.grad_scale, self.warmup = label_smoothing, grad_scale, warmup
        self.launch = self.pool = self.key = None
        self.eager = 0                       # eager steps at the current shape
        self.captures = self.replays = 0

    def invalidate(self) -> None:
        """Drops the graph (and its pool); the next call warms up and captures again."""
        self.launch = self.pool = None
        self.eager = 0

    def __call__(self, x, y):
        with self.model.grad_hook_off():     # every step alike: see ``stepper_for``
            return self._step(x, y)

    def _step(self, x, y):
        key = (x.shape, str(x.dtype), y.shape, str(y.dtype))
        if key != self.key:
            self.invalidate()
            self.key = key
        if self.launch is None:
            if self.eager < self.warmup:
                self.eager += 1
                return train_step(self.model, x, y, self.label_smoothing, self.grad_scale)
            self._capture(x, y)
        self.x[...] = x                      # device copies on the current stream, before the replay
        self.y[...] = y
        self.launch()
        self.replays += 1
        return self.out

    def _capture(self, x, y) -> None:
        xp = self.xp
        self.x, self.y = x.copy(), y.copy()  # (the static inputs, holding a real batch)
        self.out = None

        def step():                          # the loss and the error count into static outputs
            loss, errors = train_step(self.model, self.x, self.y, self.label_smoothing, self.grad_scale)
            if self.out is None:             # (allocated while capturing: the graph's pool)
                self.out = (xp.empty_like(loss), xp.empty_like(errors))
            self.out[0][...] = loss
            self.out[1][...] = errors
        self.launch, self.pool = self.capture(xp, step)   # (the hook is off: its MPI calls cannot be)
        self.captures += 1


class EagerStep:
    """The uncaptured step, called as ``CapturedStep`` is: ``step(x, y) -> (loss, errors)``;
    ``hooks``: whether backward calls the gradient hook (off on every rank of a run with
    ``train.cuda_graph``: see ``stepper_for``)."""

    captures = replays = 0

    def __init__(self, model, label_smoothing: float = 0.0, grad_scale: float = 1.0, hooks: bool = True):
        self.model, self.label_smoothing, self.grad_scale = model, label_smoothing, grad_scale
        self.hooks = hooks

    def __call__(self, x, y):
        with contextlib.nullcontext() if self.hooks else self.model.grad_hook_off():
            return train_step(self.model, x, y, self.label_smoothing, self.grad_scale)

    def invalidate(self) -> None:
        pass


def step_outputs(model, xp, batches, captured: bool, capture=cuda_capture,
                 label_smoothing: float = 0.0) -> list:
    """The loss, gradients and BN statistics of a step on each of ``batches``, each
    from the same BN statistics (the model's now, restored afterwards; its parameters untouched),
    eager or ``captured`` (one capture at the first batch, after an eager step that compiled the
    kernels, then a replay per batch): float64 host arrays, the outputs of the two batches in turn.
    The gradient hook is off throughout (the run's all-reducer is attached: no sum may start here)."""
    ps = model.ps
    start = ps.buffers.copy()
    stepper = CapturedStep(model, xp, label_smoothing, warmup=0, capture=capture) if captured else None
    out = []
    with model.grad_hook_off():
        try:
            if captured:                     # kernels compiled and plans built before the capture
                train_step(model, *batches[0], label_smoothing)
            for bx, by in batches:
                ps.buffers[...] = start
                ps.grads[...] = 0            # (what this step writes, not what one before left)
                loss = (stepper(bx, by) if captured else train_step(model, bx, by, label_smoothing))[0]
                for a in (loss, ps.grads, ps.buffers):   # (the error count: discrete, not compared)
                    a = xp.asarray(a).astype("float64")
                    out.append(a.get() if hasattr(a, "get") else a)
        finally:
            ps.buffers[...] = start
    return out


def check_batches(x, y, xp) -> list:
    """``(x, y)`` and a second batch: the images mirrored, the labels moved by one (a replay must
    read the batch it is given, not the one it was captured with)."""
    return [(x, y), (xp.flip(x, axis=2).copy(), xp.roll(y, 1))]


def captured_matches_eager(model, x, y, xp, capture=cuda_capture, label_smoothing: float = 0.0) -> dict:
    """The captured step against the eager one from the same state, on ``x, y`` and on a second
    batch (``check_batches``): the largest relative difference of each output, by name."""
    batches = check_batches(x, y, xp)
    got = step_outputs(model, xp, batches, True, capture, label_smoothing)
    want = step_outputs(model, xp, batches, False, capture, label_smoothing)
    names = OUTPUTS * len(batches)
    worst: dict[str, float] = {}
    for name, g, w in zip(names, got, want):
        rel = float(np.linalg.norm(g - w) / max(float(np.linalg.norm(w)), 1e-30))
        worst[name] = max(worst.get(name, 0.0), rel)
    return worst


def graph_components(model, backend, cfg, rows: int, capture=cuda_capture) -> list:
    """The start-up check's component for ``train.cuda_graph`` (``fastpaths.check``'s last round,
    after the whole model's): the captured step against the eager one at the run's batch of
    ``rows`` on two batches, at the tolerance of the model's fast paths.  Falling back runs the
    step uncaptured (``stepper_for`` reads the report)."""
    if not cfg.train.cuda_graph or not getattr(backend, "is_gpu", False):
        return []
    from ..fastpaths.core import MODEL_TOL, Component  # noqa: PLC0415
    xp, hw = backend.xp, cfg.data.image_size
    rng = np.random.default_rng([7, rows])
    x = xp.asarray(rng.standard_normal((rows, hw, hw, 3)).astype(np.float32))
    y = xp.asarray(rng.integers(0, model.num_classes, rows))
    batches = check_batches(x, y, xp)
    engine = model.stem_conv.engine
    return [Component(GRAPH_COMPONENT,
                      lambda: tuple(step_outputs(model, xp, batches, True, capture)),
                      lambda: tuple(step_outputs(model, xp, batches, False, capture)),
                      MODEL_TOL[getattr(engine, "precision", "fp32")], "the uncaptured step",
                      lambda: None, OUTPUTS * 2)]


def stepper_for(cfg, model, backend, grad_scale: float, report=None):
    """The run's step: ``CapturedStep`` when ``train.cuda_graph`` is on, the run is on a GPU (on
    NumPy the key changes nothing, as the other GPU-only keys: ``assemble.build`` says so once) and
    the start-up check (``report``, a ``fastpaths.Report``) used it (not checked, failed or off:
    ``EagerStep``).  With ``train.cuda_graph`` on, backward calls no gradient hook on any rank, eager
    or captured: a replay calls none, so the all-reduce's buckets all start after backward, and
    every rank must start them alike (one rank's non-blocking sums against another's blocking ones
    would never match)."""
    ls, on = cfg.train.label_smoothing, cfg.train.cuda_graph
    status = report.components.get(GRAPH_COMPONENT, {}).get("status") if report is not None else None
    if not on or not getattr(backend, "is_gpu", False) or status != "used":
        return EagerStep(model, ls, grad_scale, hooks=not on)
    return CapturedStep(model, backend.xp, ls, grad_scale)
