#!/usr/bin/env python3
"""Hierarchical against flat on the same ranks, on emulated nodes.

    python benchmarks/hierarchy.py [--nodes 4] [--ranks-per-node 2] [--rate 272mbit]
                                   [--seeds 0,1] [--epochs 6] [--variants push-ov,allreduce]
                                   [--json results/hierarchy.json]

Each variant (``push-ov``: gossip push-sum, overlapped, exponential graph; ``push-ov-uniform``: the
same on the uniform graph, as the generated ImageNet jobs; ``push-ov-uniform-1eval``: the same
evaluated only at the end, so that the bytes are the training exchanges' (each evaluation averages
the replicas, moving about as many bytes with the hierarchy as without under a node-aware
all-reduce); ``pull``: the authors' blocking pull; ``allreduce``; ``easgd`` (its server rank is a
group of its own, so node 0's other rank is a worker group of one); ``asgd`` (the same, at the job's
rate over those who push); ``localsgd``, tau 4) trains ``jobs/experiments.toml`` (ResNet-20 on the
built-in digits, batch 16 per rank) on NODES emulated nodes of RANKS_PER_NODE ranks
(``benchmarks/netcluster.py``; root needed), once flat and once with ``--hierarchy node``, per seed.
Recorded per run: the bytes every node sent and received over its link (the tc counters) per
training sample, the seconds to 10% validation error (training clock, evaluation excluded), the
final error, and the seconds per step split.  Prints a table of means over the seeds.  With
``--json`` an existing file of the same setup keeps the runs of the variants not run this time.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tables import hierarchy as table

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "jobs" / "experiments.toml"
TARGET = 0.10
PUSH_OV = ["--method", "gossip", "--gossip", "push", "--gossip-overlap"]
VARIANTS = {"push-ov": [*PUSH_OV, "--gossip-graph", "exponential"],
            "push-ov-uniform": [*PUSH_OV, "--gossip-graph", "uniform"],       # the flagship jobs' graph
            "push-ov-uniform-1eval": [*PUSH_OV, "--gossip-graph", "uniform",
                                      "--eval-every", "1000"],  # end only
            "pull": ["--method", "gossip", "--gossip", "pull"],
            "allreduce": ["--method", "allreduce"],
            "easgd": ["--method", "easgd"],                                     # a server rank alone
            "asgd": ["--method", "asgd"],          # + its rate per layout (layout_flags)
            "localsgd": ["--method", "localsgd", "--tau", "4"]}


def layout_flags(variant: str, hier: str, nodes: int, per_node: int) -> list[str]:
    """A-SGD's rate, the job's 0.1 over those who push (the default ``fit_to_world`` would give
    without the job's explicit lr): the workers flat, the worker node groups with the hierarchy
    (node 0 holds the server alone and, with more than one rank per node, a group of the rest)."""
    if variant != "asgd":
        return []
    pushers = nodes * per_node - 1 if hier == "none" else nodes - (per_node == 1)
    return ["--lr", f"{0.1 / pushers:.6g}"]


def first_reach(history: list[dict], target: float) -> float | None:
    hit = next((h for h in sorted(history, key=lambda h: h["global_samples"])
                if 1.0 - h["val_top1_accuracy"] <= target), None)
    return None if hit is None else float(hit["train_seconds"])


def one(cluster, variant: str, hier: str, seed: int, args, out: Path) -> dict:
    run_dir = out / f"{variant}-{hier}-s{seed}"
    cmd = [sys.executable, "-m", "scalesgd", "--config", str(JOB), *VARIANTS[variant],
           *layout_flags(variant, hier, args.nodes, args.ranks_per_node), "--hierarchy", hier,
           "--seed", str(seed), "--epochs", str(args.epochs), "--run-dir", str(run_dir), "--progress", "off"]
    r = cluster.run(cmd, capture=True, timeout=3600,
                    env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"hierarchy: {variant} {hier} seed {seed} failed (rc={r.returncode}):\n"
                         f"{r.stderr[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    samples = s["history"][-1]["global_samples"]
    return {"seed": seed, "time_to_target": first_reach(s["history"], TARGET),
            "final_error": 1.0 - s["val_top1_accuracy"], "samples": samples,
            "train_seconds": s["history"][-1]["train_seconds"],
            "bytes_per_sample": {n: (t.sent + t.received) / samples for n, t in r.traffic.items()},
            "traffic": {n: vars(t) for n, t in r.traffic.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--rate", default="272mbit")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--variants", default="push-ov,allreduce")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import netcluster as nc  # noqa: PLC0415 - a sibling script
    out = Path(tempfile.mkdtemp(prefix="hierarchy-"))
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {}
    with nc.NetCluster(args.nodes, rate=args.rate, prefix="sgdhier", ranks_per_node=args.ranks_per_node,
                       cpus_per_node=1) as c:
        for v in args.variants.split(","):
            for hier in ("none", "node"):
                runs[f"{v} {hier}"] = [one(c, v, hier, s, args, out) for s in seeds]
    d = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "rate": args.rate,
         "epochs": args.epochs, "target_error": TARGET, "job": "jobs/experiments.toml", "runs": runs}
    if args.json and args.json.exists():                 # keep the other variants of the same setup
        old = json.loads(args.json.read_text())
        if all(old.get(k) == d[k] for k in ("nodes", "ranks_per_node", "rate", "epochs", "target_error")):
            d["runs"] = {**old["runs"], **runs}
    print(f"hierarchy: {args.nodes} emulated nodes x {args.ranks_per_node} ranks at {args.rate}, "
          f"{args.epochs} epochs, seeds {args.seeds} (runs in {out})")
    print(table(d))
    if args.json:
        args.json.write_text(json.dumps(d, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
