"""The virtual cluster's timing against the emulated cluster's measured runs (with the
clusters' variability and the all-reduce's progress as terms of the clock).

    python benchmarks/virtual_validation.py [--seeds 2] [--out results/virtual-runs]
    python benchmarks/report.py --update docs/results.md          # the table in docs/results.md

For every run of the emulated-cluster sweep (``results/methods-net.json``: experiment 2
on emulated nodes, one rank per node, links at the papers' ratio), the virtual cluster trains the
same job (``jobs/experiments.toml`` + the run's flags, seed and epochs) with a profile built from what that
run measured of its *compute only*: ``step_seconds`` = its fastest worker's compute + data seconds
per step, the condition it computed under (its per-step spread as log-normal noise; workers more
than 25% slower than the fastest, e.g. one that shares a core with the server on 2 cores, as slow
nodes: ``sweeps/stats.compute_spread``), its link rate, 50 µs latency, one rank per node, one-sided
calls waiting for a busy target (``rma_progress = target``), and the all-reduce of host MPI over TCP
(``allreduce_progress = host``) with the factor and the hidden share that ``benchmarks/buckets.py``
measured on emulated nodes (``buckets.json``, ResNet-20: one bucket's exposed time over the pure
transfer; the auto buckets' exposed time over one bucket's).  Communication, waiting and the
method's statistics are the virtual cluster's own.  ``--no-terms`` builds the profiles as before
(no variability, the all-reduce hidden as NCCL would), for the before/after table.  It compares, per
method and p, the predicted and measured training seconds per epoch (the timing model) and time to
the sweep's target error (timing and statistics: the virtual run's own error curve, which follows
another exchange order than the real run's, as another seed would).  Writes
``results/virtual-validation.json``; finished virtual runs are reused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from benchlib import git_commit

from scalesgd.virtual.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE_DEFAULTS = Profile("emulated").to_dict()
JOB = ROOT / "jobs" / "experiments.toml"
FLAGS = {"allreduce": ["--method", "allreduce"], "easgd": ["--method", "easgd"],
         "asgd lr/p": ["--method", "asgd"], "gossip-pull": ["--method", "gossip", "--gossip", "pull",
                                                           "--mpi-progress", "none"],
         "gossip-pull-ov": ["--method", "gossip", "--gossip", "pull", "--gossip-overlap"],
         "gossip-push-ov": ["--method", "gossip", "--gossip", "push", "--gossip-overlap"]}
LATENCY_US = 50.0
COMMIT = git_commit()      # the code the virtual runs ran (run records)


def first_reach(history: list[dict], target: float) -> float | None:
    hit = next((h for h in sorted(history, key=lambda h: h["global_samples"])
                if 1.0 - h["val_top1_accuracy"] <= target), None)
    return None if hit is None else float(hit["train_seconds"])


def host_allreduce(buckets: dict) -> dict:
    """The host all-reduce's terms from ``buckets.json`` (ResNet-20 on emulated nodes)."""
    r = buckets["results"]["resnet20"]
    one, auto = r["settings"]["25 MB"]["exposed_s"], r["settings"]["auto"]["exposed_s"]
    return dict(allreduce_progress="host", host_allreduce_factor=one / r["pure_transfer_s"],
                host_hidden_fraction=max(0.0, 1.0 - auto / one))


def profile_for(run: dict, jitter_cv: float = 0.0, host: dict | None = None) -> dict:
    split, spread = run["split_per_step"], run.get("compute_spread")
    prof = dict(name="emulated", jitter_cv=jitter_cv,
                description="built from one emulated-cluster run's compute",
                step_seconds=split["compute"] + split["data"], compute_source="measured on the "
                "emulated cluster (compute + data seconds per step)",
                link_gbps=run["net"]["rate_bits"] / 1e9, latency_us=LATENCY_US, ranks_per_node=1,
                intra_gbps=100.0, mem_gbps=20.0, rma_progress="target")
    if host is None:
        return prof
    cond = dict(name="measured", source="this run's per-step compute spread (sweeps/stats.py)",
                noise=dict(dist="lognormal", cv=spread["cv"]))
    if spread["slow_share"] > 0:
        cond["slow_nodes"] = dict(fraction=spread["slow_share"] - 1e-6, factor=spread["slow_factor"])
    return dict(prof, step_seconds=spread["fastest"], variability=cond, **host)


def virtual_run(out: Path, label: str, workers: int, seed: int, epochs: int, prof: dict) -> Path:
    """The run directory of one virtual run (reused when it finished with the same profile and
    epochs)."""
    run_dir = out / f"{label.replace(' ', '').replace('/', '')}-w{workers}-s{seed}"
    if (run_dir / "summary.json").exists() and \
            json.loads((run_dir / "virtual.json").read_text())["profile"] == {**PROFILE_DEFAULTS, **prof} \
            and json.loads((run_dir / "config.json").read_text())["train"]["epochs"] == epochs:
        return run_dir
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    flags = list(FLAGS[label])
    if label == "asgd lr/p":
        flags += ["--lr", f"{0.1 / workers:.4g}"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(prof, fh)
    argv = [sys.executable, "-m", "scalesgd.virtual", "--config", str(JOB), *flags, "--seed", str(seed),
            "--workers", str(workers), "--epochs", str(epochs), "--profile", fh.name,
            "--run-dir", str(run_dir)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    os.unlink(fh.name)
    if p.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{p.stderr[-3000:]}")
    return run_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", type=Path, default=ROOT / "results/methods-net.json")
    ap.add_argument("--out", type=Path, default=ROOT / "results/virtual-runs")
    ap.add_argument("--json", type=Path, default=ROOT / "results/virtual-validation.json")
    ap.add_argument("--seeds", type=int, default=None, help="default: the sweep's")
    ap.add_argument("--jitter-cv", type=float, default=0.0, help="compute jitter of every step in "
                    "the profiles (a sensitivity check: the sweep's JSON has no step-time spread)")
    ap.add_argument("--only", nargs="*", default=None, help="sweep keys to run (default: all)")
    ap.add_argument("--no-terms", action="store_true", help="profiles without variability and with "
                    "the all-reduce hidden as NCCL would (the first validation's model)")
    a = ap.parse_args()
    if a.jitter_cv:                     # a sensitivity run keeps its own runs and JSON
        a.out = a.out.with_name(f"{a.out.name}-jitter{a.jitter_cv:g}")
        a.json = a.json.with_name(a.json.name.replace(".json", f"-jitter{a.jitter_cv:g}.json"))
    if a.no_terms:
        a.out = a.out.with_name(f"{a.out.name}-noterms")
        a.json = a.json.with_name(a.json.name.replace(".json", "-noterms.json"))
    host = (None if a.no_terms
            else host_allreduce(json.loads((ROOT / "results/buckets.json").read_text())))
    a.measured = a.measured.resolve()
    measured = json.loads(a.measured.read_text())
    target, seeds = measured["target_error"], a.seeds or measured["seeds"]
    rows, skipped = [], []
    for key, run in measured["runs"].items():
        label, w = key.rsplit("/w", 1)
        if label not in FLAGS:
            skipped.append(dict(run=key, why="no virtual counterpart"))
            continue
        if a.only is not None and key not in a.only:
            continue
        prof = profile_for(run, a.jitter_cv, host)
        dirs = [virtual_run(a.out, label, int(w), s, run["epochs"], prof) for s in range(seeds)]
        sums = [json.loads((d / "summary.json").read_text()) for d in dirs]
        ttt = [first_reach(s["history"], target) for s in sums]
        reached = [t for t in ttt if t is not None]
        epochs = run["epochs"]
        row = dict(method=label, workers=int(w), profile=prof,
                   predicted_epoch_seconds=float(np.mean([s["train_seconds"] for s in sums])) / epochs,
                   measured_epoch_seconds=run["train_seconds"]["mean"] / epochs,
                   predicted_time_to_target=float(np.mean(reached)) if reached else None,
                   predicted_reached=f"{len(reached)}/{len(ttt)}",
                   measured_time_to_target=run["time_to_target"]["mean"],
                   measured_reached=f"{run['time_to_target']['n']}/"
                                    f"{run['time_to_target']['n'] + run['time_to_target']['missing']}",
                   predicted_split=_split(dirs, int(w), label), measured_split=run["split_per_step"])
        for k in ("epoch_seconds", "time_to_target"):
            p, m = row[f"predicted_{k}"], row[f"measured_{k}"]
            row[f"{k}_error"] = None if p is None or m is None else (p - m) / m
        row.update(comm_wait_goal(row["predicted_split"], row["measured_split"]))
        rows.append(row)
        write(a, measured, target, seeds, rows, skipped)      # after every row: a piece at a time
        print(f"{key:22s} epoch s: {row['predicted_epoch_seconds']:7.2f} "
              f"vs {row['measured_epoch_seconds']:7.2f}"
              f"  ({_pct(row['epoch_seconds_error'])})   to target: {_f(row['predicted_time_to_target'])} vs "
              f"{_f(row['measured_time_to_target'])} ({_pct(row['time_to_target_error'])})", flush=True)
    summary = write(a, measured, target, seeds, rows, skipped, done=True)
    print(json.dumps(summary))
    return 0


def write(a, measured: dict, target: float, seeds: int, rows: list, skipped: list,
          done: bool = False) -> dict:
    """The JSON (rewritten after every row: an interrupted validation keeps what it finished, and
    a rerun reuses the finished virtual runs); returns its summary."""
    summary = dict(comm_wait=dict(met=sum(r["comm_wait_ok"] for r in rows), n=len(rows)))
    for k in ("epoch_seconds", "time_to_target"):
        errs = [abs(r[f"{k}_error"]) for r in rows if r[f"{k}_error"] is not None]
        summary[k] = dict(median=float(np.median(errs)) if errs else None,
                          worst=float(np.max(errs)) if errs else None, n=len(errs))
    a.json.write_text(json.dumps(dict(experiment="virtual-validation",
                                      measured=str(a.measured.relative_to(ROOT)),
                                      target_error=target, seeds=seeds, latency_us=LATENCY_US,
                                      jitter_cv=a.jitter_cv, terms=not a.no_terms, complete=done,
                                      commit=COMMIT,
                                      measured_date=measured.get("date"),
                                      rows=rows, skipped=skipped, summary=summary), indent=1) + "\n")
    return summary


def comm_wait_goal(pred: dict, meas: dict) -> dict:
    """The per-step goal: predicted comm + wait within 2x of the measured, or both within 5%
    of the measured step where they are small."""
    pc, mc = pred["comm"] + pred["wait"], meas["comm"] + meas["wait"]
    step = meas["compute"] + meas.get("data", 0.0) + mc
    ratio = pc / mc if mc > 0 else None
    ok = (ratio is not None and 0.5 <= ratio <= 2.0) or max(pc, mc) <= 0.05 * step
    return dict(comm_wait_predicted=pc, comm_wait_measured=mc, comm_wait_ratio=ratio,
                comm_wait_ok=bool(ok))


def _split(dirs: list[Path], workers: int, label: str) -> dict:
    """Seconds per local step of the first worker (its last step record), mean over the runs:
    compute (the profile's step, data included), comm, wait."""
    first = 1 if label in ("easgd", "asgd lr/p") else 0            # rank 0 serves
    rows = []
    for d in dirs:
        last = [json.loads(x) for x in (d / "metrics" / f"rank-{first}.jsonl").read_text().splitlines()
                if '"kind": "step"' in x][-1]
        n = last["step"] + 1
        rows.append({k: last[f"{k}_seconds"] / n for k in ("compute", "comm", "wait")})
    return {k: float(np.mean([r[k] for r in rows])) for k in ("compute", "comm", "wait")}


def _f(x):
    return "—" if x is None else f"{x:.2f}"


def _pct(x):
    return "—" if x is None else f"{100 * x:+.0f}%"


if __name__ == "__main__":
    sys.exit(main())
