"""What a rank spinning in MPI costs the ranks that compute beside it, and what sleeping saves.

    python benchmarks/oversubscribe.py [--ranks N] [--iters 1500] [--modes spin,yield[,throttle]]
                                       [--rounds 3] [--repeats 3] [--thread-level LEVEL]
                                       [--cpus N] [--python PATH] [--json FILE]

One ``mpiexec -n N`` job (default N = this machine's CPUs + 1, so one rank more than the node has
CPUs): rank 0 waits in ``MPI_Recv`` for a message from every other rank, as a parameter server
waits for its workers; ranks 1..N-1 each run the same fixed NumPy workload (one BLAS thread) and
send its time.  Rank 0 is the only rank waiting inside MPI: a worker waits for the next round (and,
at the end, for every other workload to end before ``MPI_Finalize``) by probing and sleeping 1 ms.
Modes, each a launch of its own:

- ``spin``: the libraries' default wait (the variables below, ``scalesgd.comm.progress.YIELD_ENV``
  and ``MPI4PY_RC_THREAD_LEVEL`` removed from the environment);
- ``yield``: each rank calls ``scalesgd.comm.progress.prepare_waiting()`` before ``MPI_Init``, as
  ``python -m scalesgd`` does: on a node with more ranks than CPUs it sets the variables that let
  a waiting rank sleep between polls.  Its line is recorded (empty: the node was not
  oversubscribed, and the mode is the same as ``spin``);
- ``throttle``: MPICH's progress throttle (``MPIR_CVAR_CH4_PROGRESS_THROTTLE=1``, a short sleep
  after 64 polls that found nothing; what the test suite sets), for comparison.

Each round runs the modes in order, then reversed (spin, yield, yield, spin), so that a drift of a
shared machine falls on all; every launch runs the workload ``--repeats`` times. (Open MPI may turn
its yield on by itself where its launcher reports the node oversubscribed, which no variable shows:
there ``spin`` and ``yield`` time the same.) ``--thread-level`` starts MPI at that level (mpi4py's
default is ``multiple``). The baseline is the same workload alone in one process of the ranks'
Python, measured before and after. Printed: the median workload time per mode, against the workload
alone (the ideal, with N - 1 workers on the node's CPUs, is about max(1, (N - 1) / CPUs)) and
against ``spin``.

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
THROTTLE_ENV = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "64"}
SPIN_UNSET = (*YIELD_ENV, *THROTTLE_ENV, "MPI4PY_RC_THREAD_LEVEL")
# each mode's environment on top of that; 'yield' is the program's own (prepare_waiting, in the rank)
MODES = {"spin": {}, "yield": {}, "throttle": THROTTLE_ENV}


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


def idle_wait(comm, source: int, tag: int, buf) -> None:
    """Receive from SOURCE without waiting inside MPI: a worker between its workloads must not be a
    second waiting rank (a blocking receive, a barrier or ``MPI_Finalize`` would poll the same way)."""
    while not comm.Iprobe(source=source, tag=tag):
        time.sleep(1e-3)
    comm.Recv(buf, source=source, tag=tag)


GO, DONE, TIME = 1, 2, 3                          # message tags


def rank_main(iters: int, repeats: int, mode: str, cpus: int | None, ranks: int) -> None:
    said = prepare_waiting(cpus=cpus) if mode == "yield" else ""
    env = {k: os.environ.get(k) for k in SPIN_UNSET}       # what MPI_Init found (with prepare_waiting's)
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != ranks:                             # e.g. one launcher's mpiexec, the other library's mpi4py
        print(f"oversubscribe: a rank of a {size}-rank job, {ranks} launched: the launcher and the "
              f"ranks' Python (--python) use different MPI libraries?", file=sys.stderr, flush=True)
        sys.exit(3)
    times = np.zeros((repeats, size))
    one = np.zeros(1)
    for r in range(repeats):
        if rank == 0:                             # the one waiting rank: a blocking receive per worker
            status = MPI.Status()
            for w in range(1, size):
                comm.Send(one, dest=w, tag=GO)
            for _ in range(size - 1):
                comm.Recv(one, source=MPI.ANY_SOURCE, tag=TIME, status=status)
                times[r, status.Get_source()] = one[0]
        else:
            idle_wait(comm, 0, GO, one)
            one[0] = workload(iters)
            comm.Send(one, dest=0, tag=TIME)
    if rank == 0:                                 # every workload is done: now the workers may finalize
        for w in range(1, size):
            comm.Send(one, dest=w, tag=DONE)
        levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                  MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
        print("RESULT " + json.dumps({"workers": times[:, 1:].tolist(), "said": said,
                                      "thread_level": levels.get(MPI.Query_thread(), "?"),
                                      "library": MPI.Get_library_version().splitlines()[0].strip(),
                                      "env": env}), flush=True)
    else:
        idle_wait(comm, 0, DONE, one)


def alone_main(iters: int, repeats: int) -> None:
    """The baseline in the ranks' Python (their NumPy and BLAS), one process, one BLAS thread."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        print("RESULT " + json.dumps([workload(iters) for _ in range(repeats)]), flush=True)


def _result(p, who: str):
    found = [ln[ln.index("RESULT ") + 7:] for ln in p.stdout.splitlines() if "RESULT " in ln]
    if p.returncode != 0 or not found:
        raise SystemExit(f"oversubscribe: {who} failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}")
    return json.loads(found[-1])


def _run(cmd: list[str], env: dict, who: str):
    """Runs one child of the benchmark (a launch or the baseline) and returns its RESULT."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"oversubscribe: {who} took over 600 s: {' '.join(cmd)}") from None
    return _result(p, who)


def launch(args, mode: str) -> dict:
    import benchlib  # noqa: PLC0415  (the ranks need none of it)
    env = {k: v for k, v in benchlib.rank_env().items() if k not in SPIN_UNSET}
    env.update(MODES[mode])
    if args.thread_level:
        env["MPI4PY_RC_THREAD_LEVEL"] = args.thread_level
    cmd = [*benchlib.mpi_launcher(args.ranks), args.python, str(Path(__file__).resolve()), "--rank",
           "--mode", mode, "--iters", str(args.iters), "--repeats", str(args.repeats),
           "--ranks", str(args.ranks)]
    if args.cpus:
        cmd += ["--cpus", str(args.cpus)]
    return _run(cmd, env, f"the {mode} launch")


def alone(args) -> list[float]:
    import benchlib  # noqa: PLC0415
    return _run([args.python, str(Path(__file__).resolve()), "--alone", "--iters", str(args.iters),
                 "--repeats", str(args.repeats)], benchlib.rank_env(), "the workload alone")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=(os.cpu_count() or 1) + 1)
    ap.add_argument("--iters", type=int, default=1500,
                    help="GEMMs per workload (its time: printed as 'alone')")
    ap.add_argument("--modes", default="spin,yield", help=f"of {', '.join(MODES)}, comma-separated")
    ap.add_argument("--rounds", type=int, default=3,
                    help="the modes in order, then reversed: this many times")
    ap.add_argument("--repeats", type=int, default=3, help="workloads per launch")
    ap.add_argument("--cpus", type=int, default=0, help="the CPU count prepare_waiting compares against")
    ap.add_argument("--thread-level", choices=("single", "funneled", "serialized", "multiple"),
                    help="the ranks' MPI thread level (MPI4PY_RC_THREAD_LEVEL; default mpi4py's: multiple)")
    ap.add_argument("--python", default=sys.executable, help="the ranks' Python (Open MPI: its venv's)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(args.iters, args.repeats, args.mode, args.cpus or None, args.ranks)
        return 0
    if args.alone:
        alone_main(args.iters, args.repeats)
        return 0
    modes = args.modes.split(",")
    if set(modes) - set(MODES) or len(set(modes)) != len(modes):
        ap.error(f"--modes {args.modes}: distinct names of {', '.join(MODES)}")
    if args.ranks < 2 or min(args.iters, args.rounds, args.repeats) < 1:
        ap.error("--ranks needs at least 2 (one waits), --iters, --rounds and --repeats at least 1")
    alone_s = alone(args)
    runs, order = {m: [] for m in modes}, (modes + modes[::-1]) * args.rounds
    for mode in order:
        res = launch(args, mode)
        runs[mode].append(res)
        first = len(runs[mode]) == 1 and res["said"]         # prepare_waiting's line, once
        print(f"{mode:>8}: workers' median {statistics.median(sum(res['workers'], [])):.3f} s"
              + (f"  ({res['said']})" if first else ""), flush=True)
    alone_s += alone(args)
    med = {m: statistics.median(x for r in rs for row in r["workers"] for x in row) for m, rs in runs.items()}
    base = statistics.median(alone_s)
    import benchlib  # noqa: PLC0415
    first = next(iter(runs.values()))[0]
    out = {"commit": benchlib.git_commit(), "cpus": os.cpu_count(), "ranks": args.ranks, "iters": args.iters,
           "modes": modes, "rounds": args.rounds, "repeats": args.repeats, "order": order,
           "library": first["library"], "thread_level": first["thread_level"],
           "thread_levels": {m: [r["thread_level"] for r in rs] for m, rs in runs.items()},
           "prepare_waiting_said": runs["yield"][0]["said"] if "yield" in runs else None,
           "alone_s": alone_s, "median_s": {"alone": base, **med},
           "over_alone": {m: med[m] / base for m in med},
           "over_spin": {m: med[m] / med["spin"] for m in med} if "spin" in med else None,
           "env": {m: rs[0]["env"] for m, rs in runs.items()},     # rank 0's, as MPI_Init found it
           "runs": {m: [r["workers"] for r in rs] for m, rs in runs.items()}}
    print(f"{out['library']}, thread level {out['thread_level']}; {args.ranks} ranks (1 waiting) on "
          f"{out['cpus']} CPUs; workload alone {base:.3f} s; median beside the waiting rank:")
    for m in modes:
        print(f"  {m:>8}  {med[m]:.3f} s  {med[m] / base:.2f}x alone"
              + (f"  {med[m] / med['spin']:.2f}x spin" if "spin" in med else ""))
    if "yield" in runs and not out["prepare_waiting_said"]:
        print("prepare_waiting() set nothing (the node is not oversubscribed): 'yield' is the default wait")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
