"""What a rank spinning in MPI costs the ranks that compute beside it, and what sleeping saves.

    python benchmarks/oversubscribe.py [--ranks N] [--iters 300] [--rounds 3] [--repeats 3]
                                       [--cpus N] [--python PATH] [--json FILE]

One ``mpiexec -n N`` job (default N = this machine's CPUs + 1, so one rank more than the node has
CPUs): rank 0 waits in ``MPI_Recv`` for a message from every other rank, as a parameter server
waits for its workers; ranks 1..N-1 each run the same fixed NumPy workload (one BLAS thread) and
send its time.  Two modes, each a launch of its own:

- ``spin``: the libraries' default wait (the variables in ``scalesgd.comm.progress.YIELD_ENV``
  and MPICH's progress throttle removed from the environment);
- ``yield``: each rank calls ``scalesgd.comm.progress.prepare_waiting()`` before ``MPI_Init``, as
  ``python -m scalesgd`` does: on a node with more ranks than CPUs it sets the variables that let
  a waiting rank sleep between polls.  Its line is recorded (empty: the node was not
  oversubscribed, and the mode is the same as ``spin``).

The modes alternate spin, yield, yield, spin, ... (``--rounds`` such pairs of pairs), so that a drift of a
shared machine falls on both; every launch runs the workload ``--repeats`` times.  The baseline is
the same workload in this process alone, measured before and after.  Printed: the median workload
time per mode, and the ratios spin / yield and mode / alone (the ideal, with N - 1 workers on the
node's CPUs, is about max(1, (N - 1) / CPUs)).

Open MPI: ``MPIEXEC=.venv-ompi-lite/bin/mpiexec MPIEXEC_ARGS="--oversubscribe --allow-run-as-root"
PYTHONPATH=src python benchmarks/oversubscribe.py --python .venv-ompi-lite/bin/python``.
``--cpus N`` passes N to ``prepare_waiting`` in place of the node's CPU count (only to try the
plumbing on a machine with many cores; the times then mean nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scalesgd.comm.progress import YIELD_ENV, prepare_waiting

# what changes how MPICH waits, removed from both modes' environment (the test suite sets the throttle)
SPIN_UNSET = (*YIELD_ENV, "MPIR_CVAR_CH4_PROGRESS_THROTTLE", "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT")


def workload(iters: int) -> float:
    """The fixed compute: ITERS GEMMs of 256 x 256 float32 and two element-wise passes; seconds."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = rng.random((256, 256), np.float32), rng.random((256, 256), np.float32)
    t = time.perf_counter()
    for _ in range(iters):
        np.dot(a, b, out=a)
        np.multiply(a, 1e-3, out=a)
        np.add(a, b, out=a)
    return time.perf_counter() - t


def rank_main(iters: int, repeats: int, mode: str, cpus: int | None) -> None:
    said = prepare_waiting(cpus=cpus) if mode == "yield" else ""
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    times = np.zeros((repeats, size))
    one = np.zeros(1)
    for r in range(repeats):
        comm.Barrier()
        if rank == 0:                             # the waiting rank: a receive per worker
            status = MPI.Status()
            for _ in range(size - 1):
                comm.Recv(one, source=MPI.ANY_SOURCE, status=status)
                times[r, status.Get_source()] = one[0]
        else:
            one[0] = workload(iters)
            comm.Send(one, dest=0)
    if rank == 0:
        print("RESULT " + json.dumps({"workers": times[:, 1:].tolist(), "said": said,
                                      "library": MPI.Get_library_version().splitlines()[0].strip(),
                                      "env": {k: os.environ.get(k) for k in SPIN_UNSET}}), flush=True)


def launch(args, mode: str) -> dict:
    import benchlib  # noqa: PLC0415  (the ranks need none of it)
    env = {k: v for k, v in os.environ.items() if k not in SPIN_UNSET}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [*benchlib.mpi_launcher(args.ranks), args.python, str(Path(__file__).resolve()), "--rank",
           "--mode", mode, "--iters", str(args.iters), "--repeats", str(args.repeats)]
    if args.cpus:
        cmd += ["--cpus", str(args.cpus)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"oversubscribe: the {mode} launch failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(lines[-1][7:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=(os.cpu_count() or 1) + 1)
    ap.add_argument("--iters", type=int, default=300, help="GEMMs per workload (300: about 1 s on one core)")
    ap.add_argument("--rounds", type=int, default=3, help="spin, yield, yield, spin: this many times")
    ap.add_argument("--repeats", type=int, default=3, help="workloads per launch")
    ap.add_argument("--cpus", type=int, default=0, help="the CPU count prepare_waiting compares against")
    ap.add_argument("--python", default=sys.executable, help="the ranks' Python (Open MPI: its venv's)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("spin", "yield"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(args.iters, args.repeats, args.mode, args.cpus or None)
        return 0
    if args.ranks < 2 or min(args.iters, args.rounds, args.repeats) < 1:
        ap.error("--ranks needs at least 2 (one waits), --iters, --rounds and --repeats at least 1")
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        alone = [workload(args.iters) for _ in range(args.repeats)]
        runs = {"spin": [], "yield": []}
        for mode in ("spin", "yield", "yield", "spin") * args.rounds:
            res = launch(args, mode)
            runs[mode].append(res)
            first = len(runs[mode]) == 1 and res["said"]         # prepare_waiting's line, once
            print(f"{mode:>5}: workers' median {statistics.median(sum(res['workers'], [])):.3f} s"
                  + (f"  ({res['said']})" if first else ""), flush=True)
        alone += [workload(args.iters) for _ in range(args.repeats)]
    med = {m: statistics.median(x for r in rs for row in r["workers"] for x in row) for m, rs in runs.items()}
    base = statistics.median(alone)
    said = runs["yield"][0]["said"]
    import benchlib  # noqa: PLC0415
    out = {"commit": benchlib.git_commit(), "cpus": os.cpu_count(), "ranks": args.ranks, "iters": args.iters,
           "rounds": args.rounds, "repeats": args.repeats, "library": runs["spin"][0]["library"],
           "prepare_waiting_said": said, "alone_s": alone, "median_s": {"alone": base, **med},
           "spin_over_yield": med["spin"] / med["yield"],
           "over_alone": {m: med[m] / base for m in med},
           "env": {m: rs[0]["env"] for m, rs in runs.items()},     # as rank 0 saw it after MPI_Init
           "runs": {m: [r["workers"] for r in rs] for m, rs in runs.items()}}
    print(f"{out['library']}; {args.ranks} ranks (1 waiting) on {out['cpus']} CPUs")
    print(f"workload alone {base:.3f} s; beside a spinning rank {med['spin']:.3f} s ({med['spin'] / base:.2f}x), "
          f"a sleeping one {med['yield']:.3f} s ({med['yield'] / base:.2f}x): spin / yield "
          f"{out['spin_over_yield']:.2f}")
    if not said:
        print("prepare_waiting() set nothing (the node is not oversubscribed): both modes spin")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
