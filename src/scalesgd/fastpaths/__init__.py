"""Start-up self-check of the GPU fast paths (``model.fast_paths`` = auto | strict | off).

Before training, each fast component the run will use runs once on small inputs, on the device in
use, and is compared with its reference twin (docs/gpu.md):

- cuDNN: one check per distinct conv geometry of the model (input H, W, C; filter; stride; pad) at
  batch ``CHECK_BATCH``: fprop, dgrad and wgrad against the im2col layers; one per distinct BN shape
  (with or without ReLU): forward and backward against the xp layers (``cudnn_checks.conv_check``);
- each fused kernel of ``nn/kernels.py`` in the run's dtypes against its ``_ref`` twin;
- DALI's GPU ("mixed") decode of a few crops of the training shards against its CPU decode;
- the all-reduce transport the ``allreduce`` method chose (``nccl``, ``cuda_aware_mpi``) against
  host-staged MPI, on a buffer whose values are still being written by queued device work (a
  collective; so :func:`check` runs after the gradient role's ``attach``);
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
{"status": "used" | "fell back" | "off", ...}}}``.  Tested on CPU with NumPy components.  Run once on
a GPU (one H200, 2026-12-04): the per-part components passed; the whole-model step failed its
fixed tolerances, on its own rounding noise (docs/gpu.md), and is now judged per tensor against
that noise: that judgment has not yet run on a GPU.

Layout: ``core.py`` (the ``Component``, comparing, ``validate``, the ``Report``), ``parts.py`` (each kind of
component), this file (``check``: the run's two rounds).  Callers use ``fastpaths.X`` for all of them.
"""
from __future__ import annotations

from .core import (CHECK_BATCH, CONV_TOL, DECODE_SAMPLES, DECODE_TOL, EVAL_ROWS, KERNEL_TOL,  # noqa: F401
                   FLOOR_CAP, FLOOR_FACTOR, MODEL_TOL, MOVE, TRANSPORT_TOL, ULP, Component, Report,
                   agree_over, compare, log, validate)
from .parts import (cudnn_components, decode_components, decode_crops, forward_gflops,  # noqa: F401
                    kernel_components, model_components, model_layers, run_batches, sound_jpegs,
                    transport_components, written_late)


# ----------------------------------------------------------------------------- the run's components
def check(cfg, topo, model, backend, loaders=(), method=None, then=None) -> Report:
    """Collective, once per run, after the gradient role's ``attach`` and before anything is written: checks
    the fast paths of this rank's ``model``, ``loaders`` and ``method`` on ``backend`` as
    ``model.fast_paths`` says and returns the run's ``Report``.  NumPy: no component, nothing runs.
    Several ranks agree unless ``train.device = cpu`` (then none is on a GPU): a rank left on NumPy
    by ``device = auto`` still takes part, so a job mixing GPU and CPU ranks cannot hang here.
    ``then``: the caller's components of a last round, made after the whole model's (the training
    step captured in a CUDA graph, ``train/graphstep.py``: it captures the layers that passed);
    None on every rank alike, or a round on every rank (it may be empty: an agreement)."""
    report = Report(cfg.model.fast_paths)
    agree = agree_over(topo.transport) if topo.size > 1 and cfg.train.device != "cpu" else None
    # two rounds: each part alone, then the whole model with the parts that passed (so a model
    # failure is the parts' integration: weight copies, views, the evaluation graphs)
    rounds = (lambda: components(model, backend, cfg, loaders, method),      # built when their
              lambda: model_components(model, backend, cfg, loaders, report))   # round comes
    for make in rounds + ((then,) if then is not None else ()):
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
    return out + transport_components(method.gradients if method is not None else None)
