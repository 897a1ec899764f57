"""Start-up self-check of the GPU fast paths (``model.fast_paths`` = auto | strict | off).

Before training, each fast component the run will use runs once on small inputs, on the device in
use, and is compared with its reference twin (docs/gpu.md):

- cuDNN: one check per distinct conv geometry of the model (input H, W, C; filter; stride; pad) at
  batch ``CHECK_BATCH``: fprop, dgrad and wgrad against the im2col layers; one per distinct BN shape
  (with or without ReLU): forward and backward against the xp layers (``cudnn_conv.conv_check``);
- each fused kernel of ``nn/kernels.py`` in the run's dtypes against its ``_ref`` twin;
- DALI's GPU ("mixed") decode of a few crops of the training shards against its CPU decode;
- the all-reduce transport the ``allreduce`` method chose (``nccl``, ``cuda_aware_mpi``) against
  host-staged MPI, on a buffer whose values are still being written by queued device work (a
  collective; so :func:`check` runs after ``method.attach``);
- then the whole model as the run uses it, with the parts that passed (``model_components``): a
  training step at the training batch after an update of the weights in place ("update then
  forward"), and each evaluation batch (ten-crop, the last partial batch) after loading another
  model into the flat buffers ("load then evaluate": the BN evaluation path), so every graph the run
  builds is built at start, on the real layers and views into the flat buffers.

``auto``: a component that fails (an output beyond its tolerance, non-finite or missing, or an
exception) is turned off with ONE warning naming it, the error and the fallback; ``strict``: a
``BackendError`` instead; ``off``: nothing is checked and every component is turned off, so only the
references run.  Ranks agree: a component that failed on any rank is turned off on every rank (so
replicas keep running the same arithmetic) and rank 0 says so once.  On NumPy there is no fast
component: nothing runs and nothing is timed (see :func:`check` for the one agreement a multi-rank
``train.device = auto`` job still makes).  A device error that leaves the GPU unusable (an illegal
address in a kernel) cannot be fallen back from: the run ends as it would have without the check.

:func:`report` is the outcome for ``summary.json``: ``{"mode", "seconds", "components": {name:
{"status": "used" | "fell back" | "off", ...}}}``.  NOT YET RUN ON A GPU: the framework is tested on
CPU with NumPy components; the GPU components have never executed.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .choices import FAST_PATH_MODES
from .errors import BackendError

log = logging.getLogger("scalesgd")

CHECK_BATCH = 2                      # batch of the cuDNN checks (real H, W, C of each layer)
# ||fast - ref|| / ||ref|| per output.  A wrong layout, stride or unwritten output is off by ~1; TF32
# (10-bit mantissa) is ~5e-4 off, which precision tf32 allows and fp32 (its graphs exclude tensor-core
# plans, nn/cudnn_conv.build_conv) must not: a float32 summation-order difference is ~1e-6
CONV_TOL = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
KERNEL_TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 1e-2}
# the whole model (logits, gradients) against its reference layers: per-layer errors compound over
# depth, so wider than CONV_TOL; a stale or wrong weight copy is off by O(1).  Estimates: not yet
# calibrated on a GPU (benchmarks/gpu_check.sh records the errors a GPU gives)
MODEL_TOL = {"fp32": 1e-3, "tf32": 5e-2, "bf16": 0.25}
EVAL_ROWS = 2                        # rows of an evaluation batch compared (eval rows are independent)
TRANSPORT_TOL = 1e-6                 # float32 sums of a few ranks: only the summation order differs
DECODE_TOL = 0.05                    # nvJPEG vs libjpeg-turbo: IDCT and chroma upsampling differ
DECODE_SAMPLES = 4


@dataclass
class Component:
    """One fast path: ``run()`` and ``reference()`` compute the same outputs (an array or a tuple
    of arrays, any xp) on the same small inputs; ``disable()`` makes the run use ``fallback``."""

    name: str                        # unique, the same on every rank (it is what ranks agree on)
    run: Callable[[], object]
    reference: Callable[[], object]
    tol: float                       # allowed ||fast - ref|| / ||ref|| of each output
    fallback: str                    # what runs instead, in words
    disable: Callable[[], None]
    outputs: tuple = ()              # names of the outputs, for messages


# ----------------------------------------------------------------------------- the outcome
class Report:
    """One run's outcome, for summary.json (owned by the run's set-up, ``Setup.fast_paths``):
    the mode, the seconds the checks took, and per component its status (``used``, ``fell back``,
    ``off``), error, fallback, relative error and seconds."""

    def __init__(self, mode: str | None = None):
        if mode is not None and mode not in FAST_PATH_MODES:
            raise ValueError(f"model.fast_paths: expected one of {', '.join(FAST_PATH_MODES)}, "
                             f"got {mode!r}")
        self.mode, self.seconds, self.components, self.gflops = mode, 0.0, {}, 0.0

    def to_dict(self) -> dict:
        return json.loads(json.dumps({"mode": self.mode, "seconds": self.seconds,
                                      "gflops": round(self.gflops, 3), "components": self.components}))


# ----------------------------------------------------------------------------- comparing
def _host64(a) -> np.ndarray:
    """A float64 NumPy copy of an xp array (CuPy: ``get()``; bf16: widened)."""
    if not isinstance(a, np.ndarray) and hasattr(a, "get"):
        a = a.get()
    return np.asarray(a).astype(np.float64)


def compare(got, want, tol: float, names: tuple = ()) -> tuple[float, str | None]:
    """(worst relative error, None) when every output of ``got`` is within ``tol`` of ``want``
    (``||a - b|| / ||b||``), else (error, what is wrong: the output, its shape or values)."""
    got, want = (tuple(v) if isinstance(v, (tuple, list)) else (v,) for v in (got, want))
    if len(got) != len(want):
        return math.inf, f"{len(got)} outputs, the reference has {len(want)}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        what = names[i] if i < len(names) else f"output {i}"
        if a is None:
            return math.inf, f"{what}: missing"
        a, b = _host64(a), _host64(b)
        if a.shape != b.shape:
            return math.inf, f"{what}: shape {a.shape}, the reference's is {b.shape}"
        bad, want_bad = ~np.isfinite(a), ~np.isfinite(b)
        if (bad & ~want_bad).any():
            return math.inf, f"{what}: {int((bad & ~want_bad).sum())} non-finite values (unwritten?)"
        if (want_bad & ~bad).any():
            return math.inf, (f"{what}: {int((want_bad & ~bad).sum())} finite values where the "
                              "reference has NaN or inf (a NaN turned into a number hides divergence)")
        if not np.array_equal(a[bad], b[bad], equal_nan=True):
            return math.inf, f"{what}: non-finite values differ from the reference's (NaN vs inf, or inf signs)"
        a, b = a[~bad], b[~bad]
        err = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
        worst = max(worst, err)
        if not err <= tol:
            return err, f"{what}: relative error {err:.2e} > tolerance {tol:.0e}"
    return worst, None


def _check(c: Component) -> tuple[float | None, str | None]:
    """Runs one component and its reference: (relative error, None) or (error or None, why).
    The reference runs even when the fast path raised: for a collective component (the all-reduce
    transport) both are collectives, and a rank that skipped the reference would enter the next
    collective while the others sit in it."""
    out = ref = None
    try:
        out = c.run()
    except Exception as exc:  # noqa: BLE001 - any failure of a fast path means "do not use it"
        failed = exc
    else:
        failed = None
    try:
        ref = c.reference()
    except Exception as exc:  # noqa: BLE001
        failed = failed or exc
    if failed is not None:
        return None, _why(failed)
    try:
        return compare(out, ref, c.tol, c.outputs)
    except Exception as exc:  # noqa: BLE001
        return None, _why(exc)


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ----------------------------------------------------------------------------- the check
def validate(components, mode: str, agree=None, speak: bool = True, report: Report | None = None,
             tally: bool = True) -> dict:
    """Checks ``components`` as ``mode`` says; records and returns each outcome ({name: dict}).

    ``agree(failed) -> failed``: this rank's {name: (error, fallback)} -> every rank's, merged in
    rank order (a collective: every rank calls it once per ``validate``, with or without
    components; None on one rank).  ``speak``: this rank writes the log lines (rank 0).  In
    ``strict`` mode a failure anywhere raises BackendError on every rank, after the agreement.
    ``tally``: end with the line counting the components checked (a caller that validates in
    rounds says it once itself)."""
    if mode not in FAST_PATH_MODES:
        raise ValueError(f"model.fast_paths: expected one of {', '.join(FAST_PATH_MODES)}, got {mode!r}")
    report = report if report is not None else Report(mode)
    if mode == "off":
        return _turn_off(components, speak, report)
    t0, measured, failed = time.perf_counter(), {}, {}
    for c in components:
        t = time.perf_counter()
        err, why = _check(c)
        measured[c.name] = {"rel_error": err if err is not None and math.isfinite(err) else None,
                            "seconds": round(time.perf_counter() - t, 6)}   # (JSON has no inf)
        if why is not None:
            failed[c.name] = (why, c.fallback)
    if agree is not None:
        failed = agree(failed)
    if failed and mode == "strict":
        raise _strict_error(failed, shared=agree is not None)
    out = {}
    for c in components:
        out[c.name] = dict(status="used", **measured[c.name])
        if c.name in failed:
            c.disable()
            out[c.name].update(status="fell back", error=failed[c.name][0], fallback=c.fallback)
    _say(failed, components, time.perf_counter() - t0, speak, tally)
    if components:                   # nothing to check (NumPy): no time is spent, none reported
        report.seconds = round(report.seconds + time.perf_counter() - t0, 6)
    report.components.update(out)
    return out


def _turn_off(components, speak: bool, report: Report) -> dict:
    """``off``: every component disabled unchecked (only the references run)."""
    out = {}
    for c in components:
        c.disable()
        out[c.name] = {"status": "off", "fallback": c.fallback}
    if components and speak:
        log.info("fast paths off (model.fast_paths = off): %d not checked, their references run",
                 len(components))
    report.components.update(out)
    return out


def _say(failed: dict, components, seconds: float, speak: bool, tally: bool = True) -> None:
    """Rank 0's lines: one warning per component that failed (on any rank), and the tally."""
    if not speak:
        return
    for name, (why, fallback) in failed.items():
        log.warning("warning: fast path %s failed its start-up check (%s): using %s instead",
                    name, why, fallback)
    if components and tally:
        log.info("fast paths: %d checked against their references in %.2f s, %d fell back",
                 len(components), seconds, len(failed))


def _strict_error(failed: dict, shared: bool) -> BackendError:
    """The one-line error of ``strict`` mode: the first failure, and how many more."""
    (name, (why, fallback)), more = next(iter(failed.items())), list(failed)[1:]
    err = BackendError(
        f"model.fast_paths = strict: fast path {name} failed its start-up check ({why})"
        + (f"; {len(more)} more failed: {', '.join(more)}" if more else "")
        + f"; --fast-paths auto would use {fallback} instead, --fast-paths off only the references")
    err.shared = shared              # the ranks agreed: every rank raises it, rank 0 reports it once
    return err


def agree_over(comm):
    """``agree`` for :func:`validate` over ``comm``: every rank's failures, merged in rank order
    (the first rank's error for a name wins, prefixed with its rank), as JSON text (no pickle)."""
    from .comm.collectives import allgather_text  # noqa: PLC0415

    def agree(failed: dict) -> dict:
        merged: dict = {}
        for rank, text in enumerate(allgather_text(comm, json.dumps(failed))):
            for name, (why, fallback) in json.loads(text).items():
                merged.setdefault(name, (f"rank {rank}: {why}", fallback))
        return merged
    return agree


# ----------------------------------------------------------------------------- the run's components
def check(cfg, topo, model, backend, loaders=(), method=None) -> Report:
    """Collective, once per run, after ``method.attach`` and before anything is written: checks
    the fast paths of this rank's ``model``, ``loaders`` and ``method`` on ``backend`` as
    ``model.fast_paths`` says and returns the run's ``Report``.  NumPy: no component, nothing runs.
    Several ranks agree unless ``train.device = cpu`` (then none is on a GPU): a rank left on NumPy
    by ``device = auto`` still takes part, so a job mixing GPU and CPU ranks cannot hang here."""
    report = Report(cfg.model.fast_paths)
    agree = agree_over(topo.comm) if topo.size > 1 and cfg.train.device != "cpu" else None
    # two rounds: each part alone, then the whole model with the parts that passed (so a model
    # failure is the parts' integration: weight copies, views, the evaluation graphs)
    for make in (lambda: components(model, backend, cfg, loaders, method),      # built when their
                 lambda: model_components(model, backend, cfg, loaders, report)):  # round comes
        comps = make()
        if comps or agree is not None:
            validate(comps, cfg.model.fast_paths, agree, speak=topo.is_root, report=report, tally=False)
    done = report.components.values()
    if done and topo.is_root and cfg.model.fast_paths != "off":
        log.info("fast paths: %d checked against their references in %.2f s (about %.0f GFLOPs), "
                 "%d fell back", len(done), report.seconds, report.gflops,
                 sum(v["status"] == "fell back" for v in done))
    return report


def components(model, backend, cfg, loaders=(), method=None) -> list[Component]:
    """Every fast component of this rank's run: none on NumPy; on a GPU the cuDNN graphs (when
    the model runs on cuDNN), the fused kernels (``model.kernels = fused``), DALI's GPU decode
    (a GPU loader) and the device all-reduce (``method`` with a device transport)."""
    if not getattr(backend, "is_gpu", False):
        return []
    engine = model.stem_conv.engine
    acts = (cfg.model.dtype,)
    out = []
    if engine is not None:
        out += cudnn_components(model, engine, cfg.data.image_size)
        if engine.precision == "bf16":              # activations are bf16 (float32 if cuDNN is off)
            acts = ("bfloat16", "float32")
    out += kernel_components(model.kernels, backend.xp, acts, cfg.model.dtype)
    out += decode_components(loaders)
    return out + transport_components(method)


def model_layers(model, n: int, hw: int) -> tuple[dict, dict]:
    """The distinct cuDNN work of ``model`` on a batch x: (n, hw, hw, 3), in forward order
    (from ``ResNet.layer_inputs``): {(x_shape, w_shape HWIO, stride, pad): [Conv]} and
    {(x_shape, relu): [BatchNorm]}."""
    from .nn import resnet as R  # noqa: PLC0415
    convs: dict = {}
    bns: dict = {}
    for mod, shape in model.layer_inputs(n, hw):
        if isinstance(mod, R.Conv):
            convs.setdefault((shape, (mod.k, mod.k, mod.cin, mod.cout), mod.stride, mod.pad), []).append(mod)
        elif isinstance(mod, R.BatchNorm):
            bns.setdefault((shape, mod.relu), []).append(mod)
    return convs, bns


def cudnn_components(model, engine, hw: int, n: int = CHECK_BATCH) -> list[Component]:
    """One component per distinct conv geometry and BN shape of ``model`` (``model_layers``) on
    ``engine`` (its precision's tolerance).  Falling back moves those layers to the xp layers;
    with bf16 activations the whole model (bf16 tensors need cuDNN in every layer)."""
    from .nn import cudnn_conv as CC  # noqa: PLC0415
    precision = getattr(engine, "precision", "fp32")
    convs, bns = model_layers(model, n, hw)
    out = []
    for (xs, ws, stride, pad), mods in convs.items():
        need_dx = any(m.need_dx for m in mods)         # False for the stem alone
        fast, ref = CC.conv_check(engine, xs, ws, stride, pad, need_dx=need_dx)
        name = f"cudnn conv {ws[0]}x{ws[1]}/s{stride} {ws[2]}->{ws[3]} at {xs[1]}x{xs[2]}"
        out.append(_layer_component(name, fast, ref, precision, mods, model,
                                    ("y", "dx", "dw") if need_dx else ("y", "dw")))
    for (xs, relu), mods in bns.items():
        fast, ref = CC.bn_check(engine, xs, relu)
        name = f"cudnn bn{'+relu' if relu else ''} {xs[3]} at {xs[1]}x{xs[2]}"
        out.append(_layer_component(name, fast, ref, precision, mods, model,
                                    ("y", "dx", "dgamma", "dbeta", "running_mean", "running_var")))
    return out


def _layer_component(name, fast, ref, precision, mods, model, outputs) -> Component:
    if precision == "bf16":
        return Component(name, fast, ref, CONV_TOL[precision], "float32 im2col for the whole model",
                         lambda: model.set_engine(None), outputs)

    def disable():
        for m in mods:
            m.engine = None
    return Component(name, fast, ref, CONV_TOL[precision], f"the xp layers for its {len(mods)} layer(s)",
                     disable, outputs)


def kernel_components(kernels, xp, acts=("float32",), par: str = "float32", fast=None) -> list[Component]:
    """One component per fused kernel of the run's ``kernels`` (``nn.kernels.Kernels``) and
    activation dtype (the SGD update: ``par``), each against its ``_ref`` twin; none with
    ``model.kernels = reference``.  Falling back turns the kernel off in ``kernels``.  ``fast``:
    {kernel: function} replacing the public kernel (a test's deliberately broken one)."""
    from .nn import kernels as K  # noqa: PLC0415
    if kernels.impl != "fused":
        return []
    out = []
    outputs = {"bn_apply": ("y",), "add_relu": ("h",), "sgd_update": ("params", "momentum")}
    for name in K.KERNEL_NAMES:
        for act in ((par,) if name == "sgd_update" else acts):
            for kind in K.CASES[name]:
                # the case is made inside the check (bf16 inputs need ml_dtypes: its absence is a failure)
                case = (lambda name=name, act=act, kind=kind:
                        K.check_case(name, xp, act, par, fast=(fast or {}).get(name), case=kind))
                label = act if kind == "random" else f"{act}, {kind}"
                out.append(Component(f"kernel {name} ({label})", lambda case=case: case()[0](),
                                     lambda case=case: case()[1](), KERNEL_TOL[act],
                                     f"its reference twin {name}_ref",
                                     lambda name=name, act=act: kernels.disable(name, act), outputs[name]))
    return out


def decode_components(loaders) -> list[Component]:
    """DALI's GPU ("mixed") decode against its CPU decode of the same crops of the first
    ``DECODE_SAMPLES`` sound JPEGs of the first GPU loader's shards.  Falling back makes every GPU
    loader decode on the CPU and copy the batches to the GPU (``Loader.cpu_decode``)."""
    gpu = [ld for ld in loaders if ld is not None and ld.device_id is not None]
    if not gpu:
        return []
    jpegs, dev = sound_jpegs(gpu[0].shards, DECODE_SAMPLES), gpu[0].device_id

    def disable():
        for ld in gpu:
            ld.cpu_decode = True
    return [Component("dali mixed decode", lambda: decode_crops(jpegs, "mixed", dev),
                      lambda: decode_crops(jpegs, "cpu", None), DECODE_TOL,
                      "CPU decode, batches copied to the GPU", disable,
                      tuple(f"crop {i}" for i in range(len(jpegs))))]


def sound_jpegs(shards, k: int, tries: int = 32) -> list[np.ndarray]:
    """Up to ``k`` encoded images from the start of ``shards`` that decode strictly (a corrupt
    sample would fail both decoders and say nothing about the GPU one)."""
    from .data.validate import decode_problem  # noqa: PLC0415
    out = []
    for i in range(min(tries, shards.num_samples)):
        data = shards.read(i)[0]
        if decode_problem(data) is None:
            out.append(data)
            if len(out) == k:
                break
    return out


def decode_crops(jpegs, device: str, device_id=None) -> list[np.ndarray]:
    """DALI's ``decoders.image_slice`` (the training loader's decoder) on ``device`` ("cpu" |
    "mixed") of each image's window x in [W/8, W - W/8), y in [H/4, H - H/4): (h, w, 3) uint8 host
    arrays."""
    from nvidia.dali import Pipeline, fn, types  # noqa: PLC0415

    from .data.validate import header_size  # noqa: PLC0415
    sizes = [header_size(j) for j in jpegs]
    start = [np.array([w // 8, h // 4], np.int32) for w, h in sizes]
    end = [np.array([w - w // 8, h - h // 4], np.int32) for w, h in sizes]
    pipe = Pipeline(batch_size=len(jpegs), num_threads=1, device_id=device_id, prefetch_queue_depth=1)
    with pipe:
        enc, s, e = fn.external_source(source=lambda: (list(jpegs), start, end), num_outputs=3,
                                       batch=True, dtype=[types.UINT8, types.INT32, types.INT32])
        pipe.set_outputs(fn.decoders.image_slice(enc, start=s, end=e, output_type=types.RGB,
                                                 adjust_orientation=False, device=device))
    pipe.build()
    (out,) = pipe.run()
    out = out.as_cpu() if device == "mixed" else out
    return [np.array(out.at(i)) for i in range(len(jpegs))]


def transport_components(method, size: int = 10_007) -> list[Component]:
    """The device all-reduce ``method`` chose (its ``reducer``: nccl or cuda_aware_mpi) against
    host-staged MPI: a fresh reducer of each class sums the same per-rank values over 3 buckets of
    a small buffer (a collective).  None for the host transport (the reference; NumPy gradients
    always have it) or a method without a gradient all-reducer.  Falling back is the method's own
    (``use_host_transport``: a host reducer over the gradients in the device one's place)."""
    red = getattr(method, "reducer", None)
    if red is None or red.transport == "host":
        return []
    from .backend import get_array_module  # noqa: PLC0415
    from .comm.collectives import BucketedAllreduce  # noqa: PLC0415
    from .nn.params import Layout, TensorSpec  # noqa: PLC0415
    comm, xp, dtype = red.comm, get_array_module(red.flat), red.flat.dtype
    lay = Layout([TensorSpec(f"t{i}", (size // 4 + i,)) for i in range(4)])
    values = np.random.default_rng([comm.Get_rank(), 5]).standard_normal(lay.size).astype(dtype)

    def reduce(cls):
        flat = written_late(xp, values)         # a fresh copy for each reducer, still being written
        r = cls(comm, flat, lay, lay.size * dtype.itemsize // 3, red.overlap)
        for spec in reversed(lay.specs):        # as backward reports them (no-op without overlap)
            r.ready([spec.name])
        r.finish()
        r.close()                               # the check's own reducer (an NCCL communicator)
        return flat
    return [Component(f"allreduce {red.transport}", lambda: reduce(type(red)),
                      lambda: reduce(BucketedAllreduce), TRANSPORT_TOL, "the host transport (MPI on "
                      "pinned host copies)", method.use_host_transport, ("sum",))]


def written_late(xp, values: np.ndarray, side: int = 2048, products: int = 8):
    """A device array that will hold ``values`` once the work queued on the current stream has run:
    ``products`` matrix products of ``side`` x ``side`` (8 x 2048^3 x 2 = 137 GFLOP: a few ms on
    an H200 in float32) are queued first, then the device-to-device copy of the values, so a
    transport that reads the buffer without waiting for the stream reads zeros.  (CuPy's default
    stream is the legacy one, which a blocking cudaMemcpy also waits for: a transport that forgets
    the wait can pass here by that accident; the host transport's side-stream copy cannot.)"""
    src = xp.array(values)
    out = xp.zeros_like(src)
    busy = xp.ones((side, side), dtype=values.dtype)
    for _ in range(products):                        # independent products: no overflow
        xp.matmul(busy, busy)
    out[...] = src
    return out


# ----------------------------------------------------------------------------- the whole model
def run_batches(cfg, loaders) -> tuple[int, list[int]]:
    """(rows of a training batch, [rows of each distinct evaluation batch]) the run's forwards
    see: ``data.batch_size``; the validation loader's full and last partial batch, times its crops
    (ten-crop: 10 rows per sample)."""
    val = [ld for ld in loaders if ld is not None and not ld.train]
    rows = []
    if val:
        n, b = len(val[0].indices(0)), val[0].batch_size
        rows = sorted({r * val[0].crops for r in ([b] if n >= b else []) + ([n % b] if n % b else [])})
    return cfg.data.batch_size, rows


def forward_gflops(model, rows: int, hw: int) -> float:
    """GFLOPs of one forward of ``model`` on (rows, hw, hw, 3): 2 per multiply-add of each conv."""
    total = 0
    for (xs, ws, stride, pad), mods in model_layers(model, rows, hw)[0].items():
        ho, wo = ((xs[i] + 2 * pad - ws[i - 1]) // stride + 1 for i in (1, 2))
        total += 2 * rows * ho * wo * ws[0] * ws[1] * ws[2] * ws[3] * len(mods)
    return total / 1e9


class _Isolated:
    """Runs model checks without a trace: the flat params, buffers and gradients, each layer's
    engine and grad hook (an all-reduce must not start from a check's backward) and the kernels'
    choice are restored on exit."""

    def __init__(self, model):
        from .nn import resnet as R  # noqa: PLC0415
        self.model, self.ps = model, model.ps
        self.leaves = [m for m in R._leaves(model.net)]

    def __enter__(self):
        ps = self.ps
        self.saved = [ps.params.copy(), ps.buffers.copy(), ps.grads.copy()]
        self.engines = [(m, m.engine) for m in self.leaves if hasattr(m, "engine")]
        self.hooks = [(m, m.grad_hook) for m in self.leaves if hasattr(m, "grad_hook")]
        self.impl = self.model.kernels.impl
        for m, _ in self.hooks:
            m.grad_hook = None
        return self

    def reference(self) -> None:
        """The reference layers and kernels for the rest of the block."""
        for m, _ in self.engines:
            m.engine = None
        self.model.kernels.impl = "reference"

    def __exit__(self, *exc):
        ps = self.ps
        for flat, saved in zip((ps.params, ps.buffers, ps.grads), self.saved):
            flat[...] = saved
        for m, e in self.engines:
            m.engine = e
        for m, h in self.hooks:
            m.grad_hook = h
        self.model.kernels.impl = self.impl


def model_components(model, backend, cfg, loaders=(), report: Report | None = None) -> list[Component]:
    """The whole model as the run uses it, on its GPU layers (none on NumPy, or with neither cuDNN
    nor fused kernels in use): one training step at the training batch after the weights were
    changed in place, and an evaluation forward at each evaluation batch after another model was
    loaded into the flat buffers, each against the reference layers and kernels.  ``report``: gets
    the checks' estimated GFLOPs.  Falling back runs the whole model on the reference."""
    if not getattr(backend, "is_gpu", False) or cfg.model.fast_paths == "off":
        return []
    from .nn import kernels as K  # noqa: PLC0415
    engine, kernels = model.stem_conv.engine, model.kernels
    if engine is None and (kernels.impl != "fused" or set(K.KERNEL_NAMES) <= kernels.disabled):
        return []                        # (nothing fast left after the first round)
    xp, hw = backend.xp, cfg.data.image_size
    tol = MODEL_TOL[getattr(engine, "precision", "fp32")]
    train_rows, eval_rows = run_batches(cfg, loaders)
    if report is not None:               # fast: 2 steps + 2 forwards each; reference: 1 step + rows
        report.gflops += (9 * forward_gflops(model, train_rows, hw)
                          + sum(2 * forward_gflops(model, r, hw) for r in eval_rows)
                          + len(eval_rows) * forward_gflops(model, EVAL_ROWS, hw))

    def fallback():
        model.set_engine(None)
        from .nn import kernels as K  # noqa: PLC0415
        for name in K.KERNEL_NAMES:
            kernels.disable(name)
    out = [Component(f"model train step after an update ({train_rows} rows)",
                     lambda: _train_after_update(model, xp, train_rows, hw, fast=True),
                     lambda: _train_after_update(model, xp, train_rows, hw, fast=False),
                     tol, "the reference layers and kernels for the whole model", fallback,
                     ("logits", "grads"))]
    for rows in eval_rows:
        out.append(Component(f"model evaluation after loading another model ({rows} rows)",
                             lambda rows=rows: _eval_after_load(model, xp, rows, hw, fast=True),
                             lambda rows=rows: _eval_after_load(model, xp, rows, hw, fast=False),
                             tol, "the reference layers and kernels for the whole model", fallback,
                             ("logits",)))
    return out


def _inputs(xp, rows: int, hw: int, seed: int):
    rng = np.random.default_rng([seed, rows])
    return (xp.array(rng.standard_normal((rows, hw, hw, 3)).astype(np.float32)),
            xp.array(rng.integers(0, 2, rows)))


def _changed(xp, a, seed: int):
    """``a`` scaled element-wise by factors in [0.5, 1.5] (the same on every rank): another model."""
    f = np.random.default_rng(seed).uniform(0.5, 1.5, a.size)
    return a * xp.array(f.astype(np.float32)).astype(a.dtype)


def _train_after_update(model, xp, rows: int, hw: int, fast: bool):
    """Logits and gradients of a training step at ``rows`` after the weights changed in place (as
    the optimizer changes them): the fast path first runs a step at the old weights, so any copy
    of them it keeps (a weight layout, a graph) must follow the update."""
    from .nn.layers import softmax_cross_entropy  # noqa: PLC0415
    x, y = _inputs(xp, rows, hw, 1)
    with _Isolated(model) as iso:
        if fast:
            logits, cache = model.forward(x, True)
            model.backward(softmax_cross_entropy(logits, y)[1], cache)
        else:
            iso.reference()
        model.ps.params[...] = _changed(xp, model.ps.params, 2)
        logits, cache = model.forward(x, True)
        model.backward(softmax_cross_entropy(logits, y)[1], cache)
        return logits.astype(np.float32), model.ps.grads.copy()


def _eval_after_load(model, xp, rows: int, hw: int, fast: bool):
    """Logits of an evaluation forward at ``rows`` after another model (weights and BN running
    statistics) was loaded into the flat buffers, as the EASGD center, a gossip average or a
    resumed model is: the fast path first evaluates the run's own model.  Evaluation rows are
    independent, so the reference computes only the first ``EVAL_ROWS`` (its cost stays small)."""
    x, _ = _inputs(xp, rows, hw, 3)
    with _Isolated(model) as iso:
        if fast:
            model.forward(x, False)
        else:
            iso.reference()
            x = x[:EVAL_ROWS]
        model.ps.params[...] = _changed(xp, model.ps.params, 4)
        model.ps.buffers[...] = _changed(xp, model.ps.buffers, 5)
        logits, _ = model.forward(x, False)
        return logits[:EVAL_ROWS].astype(np.float32)
