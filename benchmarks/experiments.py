"""The seed papers' claims as experiments anyone can rerun (results in docs/results.md).

    python benchmarks/experiments.py EXPERIMENT [--quick] [--seeds N] [--out DIR] [--no-publish]
                                     [--data DIR --tag NAME] [--image-size N] [--model NAME]
                                     [--workers P ...]

EXPERIMENT is one of sync, methods, stragglers, lr, consensus, easgd, asgd, or all.  Each runs its
sweep with real ``mpiexec`` launches of ``python -m scalesgd`` (base config ``jobs/experiments.toml``),
writes every run directory under ``OUT/runs/`` (default ``runs/experiments``; a run whose directory
already holds a ``summary.json`` for the same argv is reused, so an interrupted sweep continues),
prints a table, and writes ``results/EXPERIMENT.json`` and ``docs/figures/EXPERIMENT.png``
(``--quick`` or ``--no-publish``: both under ``OUT/`` instead).  ``--quick`` shrinks every sweep to a
smoke test of the whole path (1 epoch, 16-pixel crops, fewest settings); its numbers mean nothing.  ``--data``
(a directory made by ``python -m scalesgd.data.make_shards``), ``--image-size`` and ``--model`` are
passed to every training run, to repeat the sweeps on your own data (their run directories then go
to ``runs/experiments-NAME`` and the published files get ``--tag``: ``EXPERIMENT-TAG.json``).
``--workers`` restricts experiment 2 to the worker counts given.  The launcher is ``$MPIEXEC`` (else
the ``mpiexec`` beside this Python, else the one on PATH) with ``$MPIEXEC_ARGS`` before ``-n``, as
for the tests (docs/cli.md: launchers).

"p workers" means p ranks computing gradients; easgd and asgd add one server rank (p + 1 ranks).
Every rank is one single-threaded process: on this 2-core machine ``-n 9`` is 4.5 processes per core,
so the absolute times are those of an oversubscribed machine, not of p nodes (docs/results.md).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from benchlib import ROOT
from sweeps import runner as sweep_runner
from sweeps.asgd import AsgdSweep
from sweeps.consensus import ConsensusSweep
from sweeps.easgd import EasgdSweep
from sweeps.extensions import ExtensionsSweep
from sweeps.methods import MethodsSweep
from sweeps.runner import Net, Runner
from sweeps.stepsize import StepSizeSweep
from sweeps.stragglers import StragglersSweep
from sweeps.sync import SyncSweep

EXPERIMENTS = {"sync": SyncSweep, "methods": MethodsSweep, "stragglers": StragglersSweep,
               "lr": StepSizeSweep, "consensus": ConsensusSweep, "easgd": EasgdSweep, "asgd": AsgdSweep,
               "extensions": ExtensionsSweep}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    ap.add_argument("--quick", action="store_true", help="smoke test: smallest sweep, 1 epoch")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per setting in 'methods' (default 2)")
    ap.add_argument("--out", type=Path, help="default runs/experiments (runs/experiments-quick with --quick)")
    ap.add_argument("--no-publish", action="store_true",
                    help="write results and figures under --out, not results and docs/figures")
    ap.add_argument("--data", default="", help="a dataset directory (make_shards) instead of the digits")
    ap.add_argument("--image-size", type=int, default=0,
                    help="with --data: crop side (default: the config's)")
    ap.add_argument("--model", default="", help="override the config's model (e.g. resnet18)")
    ap.add_argument("--epochs", type=int, default=0, help="with --data: epochs of every run (default 3)")
    ap.add_argument("--target", type=float, default=0.0,
                    help=f"validation error of 'time to target' (default {sweep_runner.TARGET_ERROR})")
    ap.add_argument("--tag", default="", help="suffix of the published files (EXPERIMENT-TAG.json/.png)")
    ap.add_argument("--workers", type=int, nargs="+", default=[], help="methods: these worker counts only")
    ap.add_argument("--net", default="", metavar="papers[xF]|RATE",
                    help="run every training on an emulated cluster (benchmarks/netcluster.py; root): one "
                         "rank per node, links at the papers' ratio of transfer to step time (x F), or "
                         "at a fixed RATE such as 300mbit; results are published as EXPERIMENT-net*")
    ap.set_defaults(out=None)
    return ap


def runner_for(ap: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[Runner, bool]:
    """The runner of the parsed arguments ``a`` (its output directory, the flags every run gets, the
    emulated cluster) and whether the results are published; sets ``a.out`` and ``a.tag``."""
    if a.data:
        a.data = str(Path(a.data).resolve())            # the runs start in the repository root
    if a.out is None:                                   # quick runs never replace the full ones
        a.out = ROOT / "runs" / ("experiments-quick" if a.quick else "experiments")
    a.out = a.out.resolve()
    extra = (["--data", a.data] if a.data else []) \
        + (["--image-size", str(a.image_size)] if a.image_size else []) \
        + (["--model", a.model] if a.model else []) + (["--epochs", str(a.epochs)] if a.epochs else [])
    if a.target:
        sweep_runner.TARGET_ERROR = a.target
    if extra and a.out == (ROOT / "runs" / "experiments").resolve():
        a.out = ROOT / "runs" / f"experiments-{Path(a.data).name or a.model}"
    publish = not (a.quick or a.no_publish)
    if extra and publish and not a.tag:
        ap.error("with --data/--image-size/--model, give --tag NAME (or --no-publish): the published "
                 "results of the built-in sweeps would be replaced")
    net = Net(a.net) if a.net else None
    if net:
        a.tag = a.tag or net.tag
        if a.out == (ROOT / "runs" / "experiments").resolve():
            a.out = ROOT / "runs" / f"experiments-{net.tag}"
    return Runner(a.out, a.quick, extra=extra, net=net), publish


def main(argv=None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    runner, publish = runner_for(ap, a)
    names = list(EXPERIMENTS) if a.experiment == "all" else [a.experiment]
    t = time.perf_counter()
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        EXPERIMENTS[name](runner, a.seeds, publish=publish, tag=a.tag, workers=a.workers).run()
        print(f"== {name}: {time.perf_counter() - t0:.0f}s", flush=True)
    print(f"{runner.launched} runs launched, {runner.reused} reused, {time.perf_counter() - t:.0f}s "
          f"({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
