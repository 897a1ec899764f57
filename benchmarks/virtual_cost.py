"""What a virtual worker-step costs against a real one-rank step, and the virtual cluster's
memory; with ``--proxy``, the virtual cluster's speed on the crossover study's proxy against an
earlier commit, side by side.

    python benchmarks/virtual_cost.py [--reps 3] [--json results/virtual-cost.json]
    python benchmarks/virtual_cost.py --proxy --baseline 9f2ba62 [--reps 2]
                                      [--json results/virtual-speed.json]

``--proxy``: the same command (``jobs/glyphs.toml``: glyphs, ResNet-8 at half width, 16 px, batch
8; all-reduce, p = 128) from this tree and from ``--baseline`` (a ``git worktree`` of that commit,
run through ``PYTHONPATH``), for 1 and 2 epochs, interleaved ``--reps`` times; worker-steps per
second = the extra worker-steps of the longer run over its extra wall seconds (start-up, the
final evaluation and the checkpoint cancel).  Then one epoch at p = 1024 from each tree: its wall
seconds per worker-step (set-up included) and this tree's peak resident memory.

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
from benchlib import git_commit

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


def glyphs_data() -> Path:
    """The proxy's data set (made on first use, ~15 s)."""
    root = Path(os.environ.get("SCALESGD_GLYPHS", ROOT / "data" / "glyphs"))
    if not (root / "main").is_dir():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "glyphs.py"), str(root)], check=True)
    return root / "main"


def proxy(a) -> int:
    """``--proxy``: this tree against ``--baseline``, the same command (see the module doc)."""
    data = glyphs_data()
    trees = {"this tree": ROOT}
    tmp = tempfile.TemporaryDirectory()
    base = Path(tmp.name) / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), a.baseline],
                   check=True, capture_output=True)
    trees[f"baseline {a.baseline}"] = base
    try:
        def argv(workers, epochs):
            return ["-m", "scalesgd.virtual", "--config", "jobs/glyphs.toml", "--data", str(data),
                    "--method", "allreduce", "--workers", str(workers), "--epochs", str(epochs),
                    "--eval-every", str(epochs), "--checkpoint-every", "0", "--log-every", "100000",
                    "--threads", "1"]

        def one(tree, workers, epochs):
            with tempfile.TemporaryDirectory() as d:
                code = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
                        "subprocess.run(sys.argv[1:], check=True, capture_output=True); "
                        "print(time.perf_counter() - t, "
                        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree / "src"))
                p = subprocess.run([sys.executable, "-c", code, sys.executable, *argv(workers, epochs),
                                    "--run-dir", f"{d}/run"], cwd=tree, capture_output=True, text=True,
                                   env=env)
                if p.returncode:
                    raise SystemExit(f"{tree}: {' '.join(argv(workers, epochs))}:\n{p.stderr[-3000:]}")
                wall, kib = p.stdout.split()[-2:]
                steps = json.loads(Path(f"{d}/run/summary.json").read_text())["virtual"]["worker_steps"]
                return float(wall), steps, int(kib)
        rate: dict[str, list[float]] = {k: [] for k in trees}
        for rep in range(a.reps):
            for name, tree in trees.items():
                (w1, s1, _), (w2, s2, _) = one(tree, 128, 1), one(tree, 128, 2)
                rate[name].append((s2 - s1) / (w2 - w1))
                print(f"rep {rep} {name:24s} p=128: {rate[name][-1]:7.1f} worker-steps/s", flush=True)
        big = {}
        for name, tree in trees.items():
            wall, steps, kib = one(tree, 1024, 1)
            big[name] = dict(wall_seconds=wall, worker_steps=steps, ms_per_worker_step=1e3 * wall / steps,
                             peak_gib=kib / 2 ** 20)
            print(f"{name:24s} p=1024, 1 epoch: {wall:.1f} s, {1e3 * wall / steps:.1f} ms per worker-step "
                  f"(set-up included), peak {kib / 2 ** 20:.2f} GiB", flush=True)
        med = {k: float(np.median(v)) for k, v in rate.items()}
        base_name = f"baseline {a.baseline}"
        head = git_commit()
        out = dict(experiment="virtual-speed", date=time.strftime("%Y-%m-%d"), cores=os.cpu_count(),
                   baseline=a.baseline, commit=head, proxy="jobs/glyphs.toml, allreduce", reps=a.reps,
                   worker_steps_per_second_p128={k: dict(median=med[k], all=v) for k, v in rate.items()},
                   speedup_p128=med["this tree"] / med[base_name], p1024=big,
                   speedup_p1024=(big[base_name]["ms_per_worker_step"]
                                  / big["this tree"]["ms_per_worker_step"]))
        print(json.dumps({k: out[k] for k in ("speedup_p128", "speedup_p1024")}))
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       capture_output=True)
        tmp.cleanup()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, nargs=2, default=(1, 3))
    ap.add_argument("--json", type=Path, default=ROOT / "results/virtual-cost.json")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--proxy", action="store_true", help="the proxy's speed against --baseline")
    ap.add_argument("--baseline", default="9f2ba62", help="--proxy: the commit to compare with")
    a = ap.parse_args()
    if a.proxy:
        if a.json == ROOT / "results/virtual-cost.json":
            a.json = ROOT / "results/virtual-speed.json"
        return proxy(a)
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
