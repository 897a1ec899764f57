"""The per-step flags of the ``allreduce`` method before and after they were merged into one
all-reduce (issue 39, item 5), measured side by side on real ranks:

- before: the divergence flag (one int64) after backward, then the signals (two int64) after the
  update: two small all-reduces per step;
- after: one all-reduce of the three numbers after backward.

    python benchmarks/step_flags.py [--ranks 4] [--iters 2000] [--rounds 7] [--json OUT]

The driver launches ``mpiexec -n P python benchmarks/step_flags.py --worker`` (``$MPIEXEC`` and
``$MPIEXEC_ARGS`` choose the launcher, as for the tests). The ranks go through the program's own
transport (``MPITransport.allreduce_max_host``); the two forms alternate in rounds, so placement
noise hits both alike, and rank 0 prints each form's median microseconds per step over the rounds
and their ratio.  A step of the demo's ResNet-20 on this machine takes tens of milliseconds, so
what this saves is small against a step; it is the flags' own cost that is measured here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import git_commit, mpi_launcher, run_checked


def worker(iters: int, rounds: int) -> dict | None:
    from scalesgd.comm import start
    topo = start.init()
    t = topo.transport
    raised = np.zeros(2, np.int64)

    def before():
        t.allreduce_max_host(np.array([0], np.int64))
        t.allreduce_max_host(raised)

    def after():
        t.allreduce_max_host(np.array([0, *raised], np.int64))

    forms = {"before: two all-reduces (1 + 2 numbers)": before, "after: one all-reduce (3 numbers)": after}
    for f in forms.values():             # warm up both paths
        for _ in range(200):
            f()
    times = {k: [] for k in forms}
    for _ in range(rounds):
        for name, f in forms.items():
            t.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            times[name].append((time.perf_counter() - t0) / iters)
    if not topo.is_root:
        return None
    med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
    (b, a) = med.values()
    return {"ranks": topo.size, "iters": iters, "rounds": rounds,
            "median_us_per_step": med, "after_over_before": a / b,
            "rounds_us": {k: [x * 1e6 for x in v] for k, v in times.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[4])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        res = worker(a.iters, a.rounds)
        if res is not None:
            print("RESULT " + json.dumps(res))
        return 0
    out = []
    for p in a.ranks:
        cmd = [*mpi_launcher(p), sys.executable, __file__, "--worker", "--iters", str(a.iters),
               "--rounds", str(a.rounds)]
        proc = run_checked(cmd, f"{p} ranks", timeout=600)
        res = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
        res["commit"] = git_commit()
        out.append(res)
        print(f"{p} ranks:")
        for k, v in res["median_us_per_step"].items():
            print(f"  {k:42s} {v:8.1f} us per step")
        print(f"  after / before: {res['after_over_before']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
