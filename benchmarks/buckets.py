"""The all-reduce's bucket size on emulated nodes: how much communication each setting leaves
exposed per training step.

    python benchmarks/buckets.py --nodes 4 --rate resnet20=272mbit resnet18=2gbit [--json FILE]
    python benchmarks/buckets.py --ranks 2 --local        # one machine, no emulated links (a check)

Each rank trains its model on a fixed synthetic batch (forward, loss, backward with the gradient
hooks that start the buckets' ``Iallreduce``, the sum, the SGD step) under each setting, in
interleaved rounds of a few steps so that drift hits every setting alike:

- ``no all-reduce``: the same step without communication, the baseline;
- ``25 MB``: the former default (ResNet-20 and -18 in one bucket or two: nothing overlaps);
- ``auto``: the default now, ``buckets.auto_bucket_bytes`` (about 8 buckets, at least ranks x
  64 KiB, at most 25 MB);
- ``0.25 MB``: small fixed buckets.

Exposed communication of a setting = its median step time - the baseline's, in the same run on the
same nodes; the pure transfer is 2(p-1)/p x the gradient bytes at the link rate.  Rank 0 prints a
table; ``--json`` keeps every number.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchlib import ROOT, mpi_launcher, run_checked, synthetic_batch
from tables import buckets as table

MODELS = {"resnet20": (32, 16), "resnet18": (64, 16)}    # image side, per-rank batch
SETTINGS = ("no all-reduce", "25 MB", "auto", "0.25 MB")


def bucket_bytes(setting: str, nbytes: int, ranks: int) -> int | None:
    from scalesgd.comm.mpi.buckets import auto_bucket_bytes
    return {"no all-reduce": None, "25 MB": 25_000_000, "auto": auto_bucket_bytes(nbytes, ranks),
            "0.25 MB": 250_000}[setting]


def worker(args) -> None:
    """One rank: every setting of every model, interleaved rounds; rank 0 prints one JSON line."""
    from mpi4py import MPI

    from scalesgd.comm.mpi.device import make_allreducer
    from scalesgd.nn.resnet import ResNet
    from scalesgd.optim.sgd import SGD, SGDConfig
    from scalesgd.train.step import train_step
    comm = MPI.COMM_WORLD
    p, out = comm.Get_size(), {}
    for name in args.models:
        size, batch = MODELS[name]
        model = ResNet(name, 10, 1.0, seed=0)
        ps = model.ps
        opt = SGD(ps.params, SGDConfig(), ps.decay_mask())
        x, y = synthetic_batch(batch, size, 10, seed=comm.rank)
        reducers = {}
        for s in SETTINGS:
            b = bucket_bytes(s, ps.grads.nbytes, p)
            reducers[s] = None if b is None else make_allreducer("host", comm, ps.grads, ps.layout, b, True)

        def step(red):
            model.set_grad_hook(red.ready if red is not None else None)
            train_step(model, x, y, grad_scale=1.0 / p)
            if red is not None:
                red.finish()
            opt.step(ps.params, ps.grads, 0.01)
        times = {s: [] for s in SETTINGS}
        for s in SETTINGS:                                   # warm-up
            step(reducers[s])
        for _ in range(args.rounds):
            for s in SETTINGS:
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step(reducers[s])
                comm.Barrier()
                times[s].append((time.perf_counter() - t0) / args.steps)
        med = {s: statistics.median(v) for s, v in times.items()}
        out[name] = {"grad_bytes": int(ps.grads.nbytes), "ranks": p, "image": size, "batch": batch,
                     "settings": {s: {"bucket_bytes": bucket_bytes(s, ps.grads.nbytes, p),
                                      "buckets": len(reducers[s].buckets) if reducers[s] else 0,
                                      "step_s": times[s], "median_s": med[s],
                                      "exposed_s": med[s] - med["no all-reduce"]} for s in SETTINGS}}
    if comm.rank == 0:
        print("BUCKETS " + json.dumps(out), flush=True)


def parse_rates(items: list[str]) -> dict[str, str]:
    rates = {}
    for it in items:
        name, _, rate = it.partition("=")
        if name not in MODELS or not rate:
            raise SystemExit(f"buckets: --rate wants MODEL=RATE with MODEL in {', '.join(MODELS)}, "
                             f"got {it!r}")
        rates[name] = rate
    return rates


def run_model(args, name: str, rate: str | None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--models", name,
           "--rounds", str(args.rounds), "--steps", str(args.steps)]
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    if args.local:
        import os
        os.environ.update(env)
        res = run_checked([*mpi_launcher(args.ranks), *cmd], "buckets", 3600)
        stdout = res.stdout
    else:
        import netcluster as nc                       # a sibling: benchmarks/ is sys.path[0]
        with nc.NetCluster(args.nodes, rate=rate, prefix="sgdbkt") as cluster:
            res = cluster.run(cmd, env=env, capture=True, timeout=3600, cwd=ROOT)
        if res.returncode:
            raise SystemExit(f"buckets: {name} failed (exit {res.returncode})\n{res.stderr[-3000:]}")
        stdout = res.stdout
    line = next(ln for ln in stdout.splitlines() if ln.startswith("BUCKETS "))
    got = json.loads(line[len("BUCKETS "):])[name]
    got["rate"] = rate
    if rate is not None:
        import netcluster as nc
        p = got["ranks"]
        got["pure_transfer_s"] = 2 * (p - 1) / p * got["grad_bytes"] * 8 / nc.parse_rate(rate)
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rate", nargs="+", default=["resnet20=272mbit", "resnet18=2gbit"],
                    help="MODEL=RATE per model (each model runs on its own cluster at its rate)")
    ap.add_argument("--models", nargs="+", default=None, choices=list(MODELS))
    ap.add_argument("--local", action="store_true", help="one machine, no emulated links")
    ap.add_argument("--ranks", type=int, default=2, help="with --local")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rates = parse_rates(args.rate)
    models = args.models or list(rates)
    results = {m: run_model(args, m, None if args.local else rates[m]) for m in models}
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"nodes": None if args.local else args.nodes,
                                         "ranks": args.ranks if args.local else args.nodes,
                                         "rounds": args.rounds, "steps": args.steps,
                                         "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
