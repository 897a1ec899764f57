"""What a virtual worker-step costs against a real one-rank step, and the virtual cluster's memory
(issue 20, item 6).

    python benchmarks/virtual_cost.py [--reps 3] [--json benchmarks/results/virtual-cost.json]

Cost: the same model and batch (ResNet-20, digits, batch 16 per worker), trained (a) by one real
rank (``python -m src.main --method single``) and (b) by p = 8 virtual workers (allreduce, gossip
pull) with the ``measured`` profile, each for E1 and E2 epochs with a single evaluation at the end;
the seconds per worker-step are the difference of the wall times over the difference of the steps,
so start-up, the final evaluation and the checkpoint cancel.  The four kinds of run are interleaved
``--reps`` times (this machine is shared and noisy); medians.  Memory: peak resident set of the
virtual process (``getrusage`` of the child) for ResNet-20 at p = 32, 128 and ResNet-18 (64x64
crops) at p = 4, 8, 16, and the increment per worker from those, extrapolated to 16 GiB.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BATCH = 16


def timed(argv: list[str]) -> tuple[float, dict, int]:
    """(wall seconds, summary.json, peak RSS in KiB of this child) of one run."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "run"
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        p = subprocess.run([sys.executable, *argv, "--run-dir", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        wall = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if p.returncode:
            raise SystemExit(f"{' '.join(argv)}:\n{p.stderr[-3000:]}")
        return wall, json.loads((run_dir / "summary.json").read_text()), rss if rss > before else -1


def memory_run(argv: list[str]) -> int:
    """Peak RSS (KiB) of one run in a fresh child (ru_maxrss of a grandchild-free process)."""
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
            "capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([sys.executable, "-c", code, sys.executable, *argv, "--run-dir", f"{d}/run"],
                           cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode:
            raise SystemExit(f"{' '.join(argv)}:\n{p.stderr[-3000:]}")
        return int(p.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, nargs=2, default=(1, 3))
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/virtual-cost.json")
    ap.add_argument("--skip-memory", action="store_true")
    a = ap.parse_args()
    e1, e2 = a.epochs
    common = ["--batch-size", str(BATCH), "--log-every", "1000", "--checkpoint-every", "0"]
    kinds = {
        "real single rank": lambda e: ["-m", "src.main", "--method", "single", *common,
                                       "--epochs", str(e), "--eval-every", str(e)],
        "virtual allreduce p=8": lambda e: ["-m", "scalesgd.virtual", "--method", "allreduce",
                                            "--workers", "8", "--profile", "cpu-emulated-papers",
                                            *common, "--epochs", str(e), "--eval-every", str(e)],
        "virtual gossip p=8": lambda e: ["-m", "scalesgd.virtual", "--method", "gossip", "--gossip",
                                         "pull", "--workers", "8", "--profile", "cpu-emulated-papers",
                                         *common, "--epochs", str(e), "--eval-every", str(e)],
    }
    per_step: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(a.reps):
        for name, argv in kinds.items():
            (w1, s1, _), (w2, s2, _) = timed(argv(e1)), timed(argv(e2))
            steps = [s.get("virtual", {}).get("worker_steps") or s["samples"] // BATCH for s in (s1, s2)]
            per_step[name].append((w2 - w1) / (steps[1] - steps[0]))
            print(f"rep {rep} {name:24s} {1000 * per_step[name][-1]:7.1f} ms per worker-step "
                  f"({steps[1] - steps[0]} steps)", flush=True)
    med = {k: float(np.median(v)) for k, v in per_step.items()}
    base = med["real single rank"]
    cost = dict(epochs=[e1, e2], reps=a.reps, batch=BATCH, model="resnet20",
                seconds_per_worker_step={k: dict(median=med[k], all=v) for k, v in per_step.items()},
                ratio_to_real={k: med[k] / base for k in kinds})
    print(json.dumps(cost["ratio_to_real"]))
    memory = {}
    if not a.skip_memory:
        for model, size, ps in (("resnet20", 32, (32, 128)), ("resnet18", 64, (4, 8, 16))):
            rows = {}
            for p in ps:
                kib = memory_run(["-m", "scalesgd.virtual", "--method", "gossip", "--workers", str(p),
                                  "--model", model, "--image-size", str(size),
                                  "--scale", f"{size},{int(size * 1.25)}", "--batch-size", "8",
                                  "--epochs", "1", "--profile", "a100-100gbit", "--log-every", "1000"])
                rows[str(p)] = kib / 2 ** 20
                print(f"memory {model} p={p}: {rows[str(p)]:.2f} GiB peak", flush=True)
            xs = np.array([int(p) for p in rows])
            ys = np.array(list(rows.values()))
            slope, icpt = np.polyfit(xs, ys, 1)
            memory[model] = dict(image_size=size, peak_gib=rows, gib_per_worker=float(slope),
                                 fixed_gib=float(icpt), workers_in_16_gib=int((16 - icpt) / slope))
    a.json.write_text(json.dumps(dict(experiment="virtual-cost", date=time.strftime("%Y-%m-%d"),
                                      cores=os.cpu_count(), cost=cost, memory=memory), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
