"""The time budget of ``gpu_check.py``: what a cold first run on one GPU costs, case by case, and
which cases fit.

A first GPU contact is one short attempt on a fresh machine: every cuDNN graph is built cold and every
CuPy kernel is compiled by NVRTC on first use (no kernel cache survives from another machine).
The unit costs were first estimates, taken on the slow side; the first run on an H200 (2026-12-04)
recorded each case's real seconds beside its estimate (``plan`` in the JSON) and set them (``UNIT``).

Graph counts come from the model (``fastpaths.model_layers``; ``tests/test_gpu_check.py`` checks
them): ResNet-50 at 224 px has 23 distinct conv geometries and 12 distinct BN shapes per batch, so a
training step builds 3 x 23 - 1 (the stem has no dgrad) + 2 x 12 = 92 graphs per batch size.  The
strict self-check builds them at two batch sizes (its per-layer checks at batch 2, the whole model at
the training batch 64) plus one forward graph per conv at each of its 2 evaluation batches (46);
``results`` builds them at its own batch; parity builds 3 x 3 conv + 2 BN graphs.  Per precision:
230 + 92 + 11 = 333 graphs, 666 for fp32 and bf16.

The cases run in priority order: the environment, the strict self-check (fp32), a short training run
of the program itself (fp32: ``train``), parity (fp32), the fp32 results, the one-rank NCCL test, the
2-rank all-reduce, DALI, then bf16 (parity, training, results, the self-check).  A case is *planned*
while the estimates so far fit ``TARGET_FRACTION`` of the budget (what ``GPU_CHECK_TOTAL_S`` leaves
the check, about 330 s of a 420 s call, with room for estimates a third too low); the others run
only if time is left: before each case, the time left is compared with its estimate scaled by how
far the cases so far overran theirs (``Clock``).  A case that does not fit is recorded as not run, with why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

BUDGET_S = 480.0              # run by hand; gpu_check.sh passes what its GPU_CHECK_TOTAL_S leaves
TARGET_FRACTION = 0.75        # planned cases fit 360 s of the 480

# Unit costs, cold, on one H200, in seconds: set from the first run there (2026-12-04, cuDNN 9.19,
# frontend 1.32, CuPy 14.2, torch 2.11) -- except the steps' (step_fp32, step_bf16), which are warm
# steps' medians (the third call on, the kernel cache warm): a cold case's first steps cost more.
# Each results case now records its warm-up steps' own seconds (``warmup_s``: the first is the cold
# one) so that the next run can set them from cold steps.  The rest are about 1.2-1.5x that run's
# case totals.  Each case's measured
# seconds against this estimate: selfcheck fp32 30.8 (38.3), bf16 25.3 (40.3); parity 0.7 / 1.8
# (2.6); results fp32 128 44.2 (52.2), bf16 34.4 (33.7); nccl 2.1 (4); allreduce 2.5 (10); env 6.1
# (7).  The split among the units inside a case is not measured (graphs, kernels and steps were
# timed together): the first estimates (0.25 s a conv graph, 1 s a BN graph, 0.35 s a kernel) had the
# cases at 493 s, and they ran in 142 s.  DALI has not run there (its estimate is the old one).
UNIT = {
    "conv_graph": 0.06,       # one conv graph: validate, heuristics A + fallback, check_support, first plan
    "bn_graph": 0.12,         # one BN graph
    "kernel": 0.12,           # one CuPy elementwise/reduction kernel through NVRTC, cold cache
    "raw_module": 2.0,        # nn/kernels.py's fused CUDA module, once per dtype pair
    "cupy_start": 7.0,        # import CuPy, create the context, nvidia-smi, import the cuDNN frontend
    "torch_start": 15.0,      # import torch and create its context (first results case)
    "torch_autotune": 22.0,   # cudnn.benchmark's algorithm search in the first steps, per case
    "step_fp32": 0.16,        # a ResNet-50 training step at batch 128, float32 without TF32 (ours: 0.158)
    "step_bf16": 0.065,       # the same in bf16 (ours: 0.058-0.064)
    "selfcheck_compute": 10.0,  # the self-check's whole-model steps, references included (im2col)
    "nccl": 4.0,              # a subprocess: CuPy, NCCL init, one all-reduce, destroy
    "allreduce": 10.0,        # mpiexec -n 2: CuPy twice, each transport's sums, 102 MB timed
    "dali": 20.0,             # DALI's import, a CPU and a mixed pipeline, 256 JPEGs each (not yet run)
    "doctor": 20.0,           # mpiexec -n 2 scalesgd doctor: its MPI, all-reduce, GPU and disk rows
    "capture": 5.0,           # capturing a ResNet-50 step in a CUDA graph (a first estimate: never run)
    "train_start": 15.0,      # the program's start: imports, CuPy, MPI, DALI's GPU pipelines, shards
                              # (a first estimate: the training case has not run on a GPU)
}
KERNELS = {"selfcheck": 80, "parity": 15, "results": 20}     # distinct CuPy kernels a case compiles
RESNET50_GRAPHS = {"conv": 23, "bn": 12, "stems": 1}        # distinct per batch (fastpaths.model_layers)
EVAL_BATCHES = 2              # the self-check's evaluation batches (ten-crop 160 rows, partial 40)
PARITY_GRAPHS = {"conv": 9, "bn": 2}
TRAIN_STEPS = 8               # the training case's steps (gpu_parts.TRAIN: 2 epochs of 4), evaluations
                              # included at about one step each


def train_graphs(g=RESNET50_GRAPHS) -> tuple[int, int]:
    """(conv graphs, BN graphs) of one training step at one batch size: fprop, dgrad, wgrad per conv
    geometry (no dgrad for the stem), forward and backward per BN shape."""
    return 3 * g["conv"] - g["stems"], 2 * g["bn"]


def graph_seconds(conv: int, bn: int) -> float:
    return conv * UNIT["conv_graph"] + bn * UNIT["bn_graph"]


@dataclass
class Case:
    """One unit of the check: ``section`` (selfcheck, parity, results, nccl, allreduce, dali) with
    its precision and batch where it has them; ``estimate_s``; ``planned`` (fits the target)."""

    section: str
    precision: str | None = None
    batch: int | None = None
    estimate_s: float = 0.0
    planned: bool = True
    outcome: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return " ".join(str(v) for v in (self.section, self.precision, self.batch) if v is not None)


def estimate(case: Case, first_results: bool = False, steps_per_runner: int = 18, runners: int = 3) -> float:
    """Seconds of ``case`` on a cold machine (``first_results``: torch starts in this case;
    ``runners``: the results cases' paths)."""
    conv, bn = train_graphs()
    if case.section == "selfcheck":
        raw = UNIT["raw_module"] * (2 if case.precision == "bf16" else 1)
        return (2 * graph_seconds(conv, bn) + graph_seconds(EVAL_BATCHES * RESNET50_GRAPHS["conv"], 0)
                + KERNELS["selfcheck"] * UNIT["kernel"] + raw + UNIT["selfcheck_compute"])
    if case.section == "parity":
        return graph_seconds(PARITY_GRAPHS["conv"], PARITY_GRAPHS["bn"]) + KERNELS["parity"] * UNIT["kernel"]
    if case.section == "train":                 # the program's own start-up check, then its steps
        step = UNIT[f"step_{'bf16' if case.precision == 'bf16' else 'fp32'}"]
        return (estimate(Case("selfcheck", case.precision)) + graph_seconds(conv, bn)
                + graph_seconds(RESNET50_GRAPHS["conv"], 0) + UNIT["train_start"] + TRAIN_STEPS * 2 * step)
    if case.section == "results":
        step = UNIT[f"step_{'bf16' if case.precision == 'bf16' else 'fp32'}"] * (case.batch or 128) / 128
        return (graph_seconds(conv, bn) + KERNELS["results"] * UNIT["kernel"] + UNIT["torch_autotune"]
                + (UNIT["torch_start"] if first_results else 0.0) + runners * steps_per_runner * step)
    if case.section == "graph":                 # ResNet-50 at batch 32: its graphs, 2 eager + 2 replays
        step = UNIT[f"step_{'bf16' if case.precision == 'bf16' else 'fp32'}"] / 4
        return graph_seconds(conv, bn) + KERNELS["results"] * UNIT["kernel"] + 8 * step + UNIT["capture"]
    return UNIT[case.section]


def cases(precisions, batches, sections) -> list[Case]:
    """Every case of a run, in priority order (see the module docstring)."""
    first = [p for p in precisions if p != "bf16"][:1] or list(precisions)[:1]
    rest = [p for p in precisions if p not in first]
    out = []

    def add(section, precision=None, batch=None):
        if section in sections:
            out.append(Case(section, precision, batch))
    for p in first:
        add("selfcheck", p)
        add("train", p)                          # the program itself, after its parts' check
        add("parity", p)
        for b in batches:
            add("results", p, b)
        add("graph", p)                          # the captured step against the eager one
    for s in ("nccl", "allreduce", "dali", "doctor"):
        add(s)
    for p in rest:                               # cheapest first: parity, training, results, the self-check
        add("parity", p)
        add("train", p)
        for b in batches:
            add("results", p, b)
        add("selfcheck", p)
    return out


def plan(precisions, batches, sections, budget_s: float = BUDGET_S, steps_per_runner: int = 18,
         env_s: float = UNIT["cupy_start"], runners: int = 3) -> tuple[list[Case], float]:
    """The run's cases with their estimates, planned while the running total (the environment's
    ``env_s`` first) fits ``TARGET_FRACTION * budget_s``; returns (cases, that target)."""
    target = TARGET_FRACTION * budget_s
    total, seen_results = env_s, False
    out = cases(precisions, batches, sections)
    for c in out:
        first = c.section == "results" and not seen_results
        c.estimate_s = round(estimate(c, first, steps_per_runner, runners), 1)
        seen_results |= c.section == "results"
        c.planned = total + c.estimate_s <= target
        total += c.estimate_s if c.planned else 0.0
    return out, target


def plan_lines(out: list[Case], target: float, budget_s: float,
               env_s: float = UNIT["cupy_start"]) -> list[str]:
    """The plan as printed at the start of a run (one line per case)."""
    planned = env_s + sum(c.estimate_s for c in out if c.planned)
    lines = [f"plan: budget {budget_s:.0f} s; planned cases fit {target:.0f} s (estimates for a cold "
             f"H200, set from one run there); env {env_s:.0f} s"]
    lines += [f"plan {c.name:22s} {c.estimate_s:6.1f} s  {'planned' if c.planned else 'if time is left'}"
              for c in out]
    every = env_s + sum(c.estimate_s for c in out)
    lines.append(f"plan: planned {planned:.0f} s of {target:.0f} s; all cases {every:.0f} s")
    return lines


class Clock:
    """The run's budget while it runs: ``fits(case)`` when the time left covers the case's
    estimate, scaled up by how far the finished cases overran their estimates (never down)."""

    def __init__(self, budget_s: float, start: float | None = None):
        self.budget_s, self.start = budget_s, time.perf_counter() if start is None else start
        self.estimated = self.spent = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def scale(self) -> float:
        return max(1.0, self.spent / self.estimated) if self.estimated > 0 else 1.0

    def fits(self, case: Case) -> bool:
        return self.elapsed() + case.estimate_s * self.scale() <= self.budget_s

    def done(self, case: Case, seconds: float) -> None:
        self.estimated += case.estimate_s
        self.spent += seconds
