"""The self-check's components (``fastpaths/``): cuDNN graphs, fused kernels, DALI's GPU decode,
the device all-reduce, and the whole model with the parts that passed; each a ``core.Component``
(the fast twin, its reference, its tolerance, its fallback)."""
from __future__ import annotations


import numpy as np

from .core import (CHECK_BATCH, CONV_TOL, DECODE_SAMPLES, DECODE_TOL, EVAL_ROWS, KERNEL_TOL, MODEL_TOL,
                   MOVE, TRANSPORT_TOL, Component, Report, _host64)


def model_layers(model, n: int, hw: int) -> tuple[dict, dict]:
    """The distinct cuDNN work of ``model`` on a batch x: (n, hw, hw, 3), in forward order
    (from ``ResNet.layer_inputs``): {(x_shape, w_shape HWIO, stride, pad): [Conv]} and
    {(x_shape, relu): [BatchNorm]}."""
    from ..nn import resnet as R  # noqa: PLC0415
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
    from ..nn import cudnn_checks as CC  # noqa: PLC0415
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
    from ..nn import kernels as K  # noqa: PLC0415
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
    from ..data.validate import decode_problem  # noqa: PLC0415
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

    from ..data.validate import header_size  # noqa: PLC0415
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


def transport_components(gradients, size: int = 10_007) -> list[Component]:
    """The device all-reduce a method's gradient role chose (its ``engine``: nccl or
    cuda_aware_mpi) against host-staged MPI: a fresh reducer of each kind (``reducer_like`` of the
    role's own group, so nothing here calls MPI) sums the same per-rank values over 3 buckets of a
    small buffer (a collective over that group).  None for the host transport (the reference; NumPy
    gradients always have it) or a role without an all-reducer.  Falling back is the role's own
    (``use_host_transport``: a host reducer over the gradients in the device one's place)."""
    red = gradients.engine if gradients is not None else None
    if red is None or red.transport.startswith("host"):     # (also "host (two-level)")
        return []
    from ..backend import get_array_module  # noqa: PLC0415
    from ..nn.params import Layout, TensorSpec  # noqa: PLC0415
    net, xp, dtype = gradients.group, get_array_module(red.flat), red.flat.dtype
    lay = Layout([TensorSpec(f"t{i}", (size // 4 + i,)) for i in range(4)])
    values = np.random.default_rng([net.rank, 5]).standard_normal(lay.size).astype(dtype)

    def reduce(host: bool):
        flat = written_late(xp, values)         # a fresh copy for each reducer, still being written
        r = net.reducer_like(red, flat, lay, lay.size * dtype.itemsize // 3, host)
        for spec in reversed(lay.specs):        # as backward reports them (no-op without overlap)
            r.ready([spec.name])
        r.finish()
        r.close()                               # the check's own reducer (an NCCL communicator)
        return flat
    return [Component(f"allreduce {red.transport}", lambda: reduce(False),
                      lambda: reduce(True), TRANSPORT_TOL, "the host transport (MPI on "
                      "pinned host copies)", gradients.use_host_transport, ("sum",))]


def written_late(xp, values: np.ndarray, side: int = 2048, products: int = 8):
    """A device array that will hold ``values`` once the work queued on the current stream has run:
    ``products`` matrix products of ``side`` x ``side`` (8 x 2048^3 x 2 = 137 GFLOP: a few ms on
    an H200 in float32) are queued first, then the device-to-device copy of the values, so a
    transport that reads the buffer without waiting for the stream reads zeros.  (CuPy's default
    stream is the legacy one, which a blocking cudaMemcpy also waits for: a transport that forgets
    the wait can pass here by that accident; the host transport's side-stream copy cannot.)  On
    the host nothing is ever in flight: the values themselves, without the products."""
    if xp is np:
        return np.array(values)
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
        from ..nn import resnet as R  # noqa: PLC0415
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
    from ..nn import kernels as K  # noqa: PLC0415
    engine, kernels = model.stem_conv.engine, model.kernels
    if engine is None and (kernels.impl != "fused" or set(K.KERNEL_NAMES) <= kernels.disabled):
        return []                        # (nothing fast left after the first round)
    xp, hw = backend.xp, cfg.data.image_size
    tol = MODEL_TOL[getattr(engine, "precision", "fp32")]
    train_rows, eval_rows = run_batches(cfg, loaders)
    if report is not None:               # fast: 2 steps + 2 forwards each; reference: 2 steps (one
        report.gflops += (12 * forward_gflops(model, train_rows, hw)      # on moved images) + rows
                          + sum(2 * forward_gflops(model, r, hw) for r in eval_rows)
                          + len(eval_rows) * forward_gflops(model, EVAL_ROWS, hw))

    def fallback():
        model.set_engine(None)
        from ..nn import kernels as K  # noqa: PLC0415
        for name in K.KERNEL_NAMES:
            kernels.disable(name)
    # logits and each parameter's gradient on its own (a tolerance per tensor: one layer's wrong
    # gradient is not hidden in the norm of the whole vector, nor by another tensor's floor)
    names = ("logits", *(s.name for s in model.ps.layout.specs))
    out = [Component(f"model train step after an update ({train_rows} rows)",
                     lambda: _train_after_update(model, xp, train_rows, hw, fast=True),
                     lambda: _train_after_update(model, xp, train_rows, hw, fast=False),
                     tol, "the reference layers and kernels for the whole model", fallback, names,
                     lambda: _train_after_update(model, xp, train_rows, hw, fast=False,
                                                 move=MOVE[getattr(engine, "precision", "fp32")]))]
    for rows in eval_rows:
        out.append(Component(f"model evaluation after loading another model ({rows} rows)",
                             lambda rows=rows: _eval_after_load(model, xp, rows, hw, fast=True),
                             lambda rows=rows: _eval_after_load(model, xp, rows, hw, fast=False),
                             tol, "the reference layers and kernels for the whole model", fallback,
                             ("logits",)))
    return out


def _inputs(xp, rows: int, hw: int, seed: int, move: float = 0.0):
    """Images and labels; ``move``: each pixel moved up or down by that relative amount (the
    precision's rounding unit: the floor, core.MOVE)."""
    rng = np.random.default_rng([seed, rows])
    x = rng.standard_normal((rows, hw, hw, 3)).astype(np.float32)
    if move:
        x = (x * (1 + move * np.random.default_rng([seed, rows, 1]).choice([-1.0, 1.0], x.shape)))
    return xp.array(x.astype(np.float32)), xp.array(rng.integers(0, 2, rows))


def _changed(xp, a, seed: int):
    """``a`` scaled element-wise by factors in [0.5, 1.5] (the same on every rank): another model."""
    f = np.random.default_rng(seed).uniform(0.5, 1.5, a.size)
    return a * xp.array(f.astype(np.float32)).astype(a.dtype)


def _train_after_update(model, xp, rows: int, hw: int, fast: bool, move: float = 0.0):
    """Logits and gradients of a training step at ``rows`` after the weights changed in place (as
    the optimizer changes them): the fast path first runs a step at the old weights, so any copy
    of them it keeps (a weight layout, a graph) must follow the update.  ``move``: the images
    moved by it (the reference's rounding noise, core.FLOOR_FACTOR)."""
    from ..nn.layers import softmax_cross_entropy  # noqa: PLC0415
    x, y = _inputs(xp, rows, hw, 1, move)
    with _Isolated(model) as iso:
        if fast:
            logits, cache = model.forward(x, True)
            model.backward(softmax_cross_entropy(logits, y)[1], cache)
        else:
            iso.reference()
        model.ps.params[...] = _changed(xp, model.ps.params, 2)
        logits, cache = model.forward(x, True)
        model.backward(softmax_cross_entropy(logits, y)[1], cache)
        grads = _host64(model.ps.grads)              # one copy to the host, split by tensor
        lay = model.ps.layout
        return (_host64(logits.astype(np.float32)),
                *(grads[slice(*lay.offsets[s.name])] for s in lay.specs))


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
