"""Does a one-sided call wait for a busy target across nodes?  And what does making it not wait cost?

    python benchmarks/rma_progress.py [--modes default,async,thread1,thread10] [--repeats 5]
                                      [--rate 1gbit] [--cpus-per-node 1] [--bytes 1089896]
                                      [--busy numpy|python] [--local] [--mpiexec PATH] [--json FILE]
    python benchmarks/rma_progress.py --train [--nodes 3] [--variants pull,push,pull-ov,push-ov]
                                      [--modes none,auto,mpi,threadN] [--baseline] [--json FILE]

Two ranks on two emulated nodes (``benchmarks/netcluster.py``; root needed), each node bound to
``--cpus-per-node`` CPUs (default 1), or, with ``--local``, one plain ``mpiexec`` on this node (MPICH:
shared memory).  Windows as gossip uses them (``comm/mpi/window.py``): ``Win.Allocate``, one
``Lock_all(MODE_NOCHECK)`` epoch, every call followed by ``Flush``.  Rank 1 is the target, rank 0
the origin; the probe is the project's one (``scalesgd.comm.mpi.probe.RmaProbe``, which ``scalesgd
doctor`` uses too).  For each operation -- ``Get`` and ``Accumulate(SUM)`` of BYTES (default: ResNet-20's
272,474 float32 parameters), ``Fetch_and_op(SUM)`` of one int64 (gossip's sample counter) -- the
origin times the call plus ``Flush``:

- *idle target*: the target waits in ``MPI_Barrier`` (inside MPI, so progressing);
- *busy target*: the target computes outside MPI for 1 s (NumPy GEMMs, or with ``--busy python`` a
  pure-Python loop holding the GIL); the origin starts 0.1 s after both left a barrier.  ~900 ms
  means the call waited for the target to enter MPI.

And the price: both ranks run the same fixed NumPy workload at once (one BLAS thread each, as
training does), timed per rank, and the CPU seconds that each rank's other threads (a progress
thread) burnt per second of it -- a measure that other processes on a busy machine disturb less;
for ``threadN`` also the workload's time with the thread over without, in pairs run back to back.

Modes (each one ``mpiexec`` launch): ``default``; ``async`` = ``MPIR_CVAR_ASYNC_PROGRESS=1`` (MPICH
starts a progress thread per rank); ``tcpthread`` = ``OMPI_MCA_btl_tcp_progress_thread=1``
(Open MPI's TCP BTL); ``threadN`` = a Python thread of ours in each rank that calls
``MPI.Comm.Iprobe`` every N ms (it sleeps in between; NumPy releases the GIL).  Prints a
table per mode (medians over REPEATS, max in brackets) and the traffic over the emulated links.

``--train`` runs real gossip training instead (``python -m scalesgd --method gossip``, one rank on
each of ``--nodes`` emulated nodes, the built-in digits unless ``--train-args`` says otherwise),
once per variant (``pull``, ``push``, ``pull-ov``, ``push-ov``: overlapped) and mode, where a mode is
a ``--mpi-progress`` setting (``none``, ``auto``: the default, ``mpi``) or ``threadN`` (the progress
thread every N ms).  With ``--baseline`` each variant also runs with the same ranks on one node.
Prints the seconds per step split as the program reports them (compute, comm, wait; mean over
ranks) and the bounds it is held to: comm + wait against the time the bytes that crossed a node's link
take at the link rate, the median wait per exchange, compute against the one-node run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from tables import mpi_progress as table

BUSY_SECONDS, ORIGIN_DELAY = 1.0, 0.1
OPS = ("get", "accumulate", "fetch_and_op")        # result keys, in probe.RMA_OPS order


# ---- rank side ---------------------------------------------------------------------------------

def workload(a, b) -> float:
    """The fixed compute whose time async progress may inflate: 300 GEMMs + element-wise passes."""
    import numpy as np
    t = time.perf_counter()
    for _ in range(300):
        np.dot(a, b, out=a)
        np.multiply(a, 1e-3, out=a)
        np.add(a, b, out=a)
    return time.perf_counter() - t


def start_poller(comm, period_ms: float) -> threading.Event:
    """A daemon thread calling Iprobe (which runs MPI's progress engine) every ``period_ms``."""
    stop = threading.Event()

    def poll():
        while not stop.wait(period_ms / 1000):
            comm.Iprobe()

    threading.Thread(target=poll, daemon=True, name="mpi-progress").start()
    return stop


def rank_main(nbytes: int, repeats: int, poll_ms: float, kind: str) -> None:
    import numpy as np
    from mpi4py import MPI

    from scalesgd.comm.mpi.probe import RMA_OPS, RmaProbe, busy
    comm = MPI.COMM_WORLD
    stop = start_poller(comm, poll_ms) if poll_ms > 0 else None
    rng = np.random.default_rng(comm.Get_rank())
    a, b = rng.random((256, 256), np.float32), rng.random((256, 256), np.float32)
    probe = RmaProbe(comm, nbytes)              # the project's one probe (scalesgd doctor's too)
    res = {f"{op}_{state}": [] for op in OPS for state in ("idle", "busy")}
    for _ in range(repeats):
        for op, name in zip(OPS, RMA_OPS):
            for state in ("idle", "busy"):
                dt = probe.round(name, 0, 1, BUSY_SECONDS if state == "busy" else 0.0,
                                 lambda secs: busy(secs, kind), head_start=ORIGIN_DELAY)
                if dt is not None:
                    res[f"{op}_{state}"].append(dt)
    compute, other_cpu = [], []
    for _ in range(repeats):
        comm.Barrier()
        cpu0, own0 = time.process_time(), time.thread_time()
        compute.append(workload(a, b))
        # CPU seconds this process's other threads (a progress thread) burnt per second of compute
        other_cpu.append((time.process_time() - cpu0 - (time.thread_time() - own0)) / compute[-1])
    paired = paired_poller_cost(comm, poll_ms, stop, repeats, a, b) if stop is not None else []
    gathered = [comm.gather(x, root=0) for x in (compute, other_cpu, paired)]
    probe.free()
    if comm.Get_rank() == 0:
        res["compute"], res["other_threads_cpu"], res["poller_on_off"] = gathered
        print("RESULT " + json.dumps(res), flush=True)


def paired_poller_cost(comm, poll_ms: float, stop, repeats: int, a, b) -> list[float]:
    """The workload's time with the polling thread over its time without, in pairs run back to back
    (so a busy machine's drift cancels).  Stops the given poller; leaves a new one running."""
    ratios = []
    for _ in range(2 * repeats):
        stop.set()
        comm.Barrier()
        off = workload(a, b)
        stop = start_poller(comm, poll_ms)
        comm.Barrier()
        ratios.append(workload(a, b) / off)
    return ratios


# ---- driver --------------------------------------------------------------------------------------

def mode_env(mode: str) -> tuple[dict, float]:
    """(environment, poll period ms) of a mode."""
    if mode == "default":
        return {}, 0.0
    if mode == "async":                          # MPICH
        return {"MPIR_CVAR_ASYNC_PROGRESS": "1"}, 0.0
    if mode == "tcpthread":                      # Open MPI's TCP BTL
        return {"OMPI_MCA_btl_tcp_progress_thread": "1"}, 0.0
    if mode.startswith("thread") and mode[6:].replace(".", "", 1).isdigit():
        return {}, float(mode[6:])
    raise SystemExit(f"rma_progress: unknown mode {mode!r} (default, async, tcpthread, threadN)")


def launch(args, mode: str, cluster) -> dict:
    env, poll = mode_env(mode)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", "--bytes", str(args.bytes),
           "--repeats", str(args.repeats), "--poll-ms", str(poll), "--busy", args.busy]
    env = {**env, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if cluster is None:                          # the benchmarks' launcher: $MPIEXEC, $MPIEXEC_ARGS
        import benchlib
        launcher = [args.mpiexec, "-n", "2"] if args.mpiexec else benchlib.mpi_launcher(2)
        p = subprocess.run([*launcher, *cmd], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=600)
        rc, out, err, traffic = p.returncode, p.stdout, p.stderr, None
    else:
        r = cluster.run(cmd, mpiexec=args.mpiexec, env=env, capture=True, timeout=600)
        rc, out, err, traffic = r.returncode, r.stdout, r.stderr, r.traffic
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if rc != 0 or not lines:
        raise SystemExit(f"rma_progress: mode {mode} failed (rc={rc}):\n{out}\n{err}")
    res = json.loads(lines[-1][7:])
    res["traffic"] = {n: vars(t) for n, t in traffic.items()} if traffic else None
    return res


def report(mode: str, res: dict) -> str:
    ms = lambda xs: f"{statistics.median(xs) * 1e3:8.2f} [{max(xs) * 1e3:7.1f}]"   # noqa: E731
    rows = [f"mode {mode}:  origin's call + Flush, ms: median [max]",
            f"  {'operation':<14}{'idle target':>20}{'busy target (1 s)':>22}"]
    for op in OPS:
        rows.append(f"  {op:<14}{ms(res[op + '_idle']):>20}{ms(res[op + '_busy']):>22}")
    comp = ", ".join(f"rank {r} {statistics.median(c):.3f} s" for r, c in enumerate(res["compute"]))
    rows.append(f"  fixed NumPy workload, both ranks at once (median): {comp}")
    cpu = ", ".join(f"rank {r} {statistics.median(c):.2f}" for r, c in enumerate(res["other_threads_cpu"]))
    rows.append(f"  meanwhile, CPU of the ranks' other threads per second (median): {cpu}")
    if any(res.get("poller_on_off") or []):
        pair = [x for xs in res["poller_on_off"] for x in xs]
        rows.append(f"  workload with / without the polling thread, back to back (median of {len(pair)}): "
                    f"{statistics.median(pair):.3f}")
    if res.get("traffic"):
        rows.append("  bytes sent over the links: " + ", ".join(
            f"{n} {t['sent'] / 1e6:.1f} MB" for n, t in res["traffic"].items()))
    return "\n".join(rows)


# ---- the same modes in real gossip training --------------------------------------------------

TRAIN_MODES = ("none", "auto", "mpi")       # --train: dist.mpi_progress settings (and threadN)
VARIANTS = {"pull": ["--gossip", "pull"], "push": ["--gossip", "push"],
            "pull-ov": ["--gossip", "pull", "--gossip-overlap"],
            "push-ov": ["--gossip", "push", "--gossip-overlap"]}


def train_flags(mode: str) -> list[str]:
    """The program's flags for a --train mode: a ``dist.mpi_progress`` setting, or ``threadN``
    (the progress thread every N ms)."""
    if mode in TRAIN_MODES:
        return ["--mpi-progress", mode]
    if mode.startswith("thread") and mode[6:].replace(".", "", 1).isdigit():
        return ["--mpi-progress", "thread", "--mpi-progress-ms", mode[6:]]
    raise SystemExit(f"rma_progress --train: unknown mode {mode!r} ({', '.join(TRAIN_MODES)}, threadN)")


def last_steps(run_dir: Path) -> list[dict]:
    """Every rank's last step record (its cumulative seconds)."""
    rows = []
    for f in sorted((run_dir / "metrics").glob("rank-*.jsonl")):
        steps = [json.loads(ln) for ln in f.read_text().splitlines() if '"kind": "step"' in ln]
        rows.append(steps[-1])
    return rows


def train_one(cluster, mode: str, variant: str, args, out: Path) -> dict:
    """One gossip run on the cluster under a progress mode; per-step seconds averaged over ranks,
    and the bytes per step that crossed each node's link (the larger of sent and received)."""
    run_dir = out / f"{variant}-{mode}-{cluster.nodes}n"
    program = ["--method", "gossip", *VARIANTS[variant], *train_flags(mode), "--run-dir", str(run_dir),
               "--progress", "off", *args.train_args.split()]
    r = cluster.run([sys.executable, "-m", "scalesgd", *program], mpiexec=args.mpiexec, capture=True,
                    timeout=1200, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise SystemExit(f"rma_progress: gossip {variant} {mode} failed (rc={r.returncode}):\n{r.stderr}")
    last = last_steps(run_dir)
    per_step = {k: statistics.mean(s[k] / s["step"] for s in last)
                for k in ("train_seconds", "data_seconds", "compute_seconds", "comm_seconds", "wait_seconds")}
    steps = statistics.mean(s["step"] for s in last)
    link = max(max(t.sent, t.received) for t in r.traffic.values()) / max(1, cluster.ranks_per_node)
    return {"per_step": per_step, "steps": [s["step"] for s in last],
            "wait_per_exchange": sorted(s["wait_seconds"] / max(1, s["gossip_exchanges"]) for s in last),
            "link_bytes_per_step": link / steps if cluster.nodes > 1 else 0.0,
            "traffic": {n: vars(t) for n, t in r.traffic.items()}}


def acceptance(res: dict, base: dict | None, rate_bits: int) -> dict:
    """The bounds for one run: comm + wait per step against the transfer of its bytes at the
    link rate (<= 1.5x), the median wait per exchange (<= 10 ms), compute per step against the same
    variant on one node (<= 1.10x)."""
    ps = res["per_step"]
    transfer = res["link_bytes_per_step"] * 8 / rate_bits
    out = {"comm_wait": ps["comm_seconds"] + ps["wait_seconds"], "transfer": transfer,
           "share": (ps["comm_seconds"] + ps["wait_seconds"]) / ps["train_seconds"],
           "median_wait": statistics.median(res["wait_per_exchange"])}
    out["vs_transfer"] = out["comm_wait"] / transfer if transfer else None
    out["compute_vs_one_node"] = (ps["compute_seconds"] / base["per_step"]["compute_seconds"]
                                  if base else None)
    return out


def train(args) -> int:
    import tempfile
    import netcluster as nc
    modes, variants = args.modes.split(","), args.variants.split(",")
    for m in modes:
        train_flags(m)
    out = Path(tempfile.mkdtemp(prefix="rma-progress-train-"))
    base = {}
    if args.baseline:                         # the same ranks on one node: the compute reference
        cpus = min(os.cpu_count(), args.nodes * args.cpus_per_node) if args.cpus_per_node else 0
        with nc.NetCluster(1, ranks_per_node=args.nodes, prefix="sgdrmb", cpus_per_node=cpus) as c:
            base = {v: train_one(c, "auto", v, args, out) for v in variants}
    with nc.NetCluster(args.nodes, rate=args.rate, prefix="sgdrmt", cpus_per_node=args.cpus_per_node) as c:
        results = {f"{v} {m}": train_one(c, m, v, args, out) for v in variants for m in modes}
    for name, res in results.items():
        res["acceptance"] = acceptance(res, base.get(name.split()[0]), nc.parse_rate(args.rate))
    print(f"rma_progress --train: gossip on {args.nodes} emulated nodes at {args.rate} "
          f"({args.cpus_per_node or 'all'} CPU(s) each), flags: {args.train_args} (runs in {out})")
    print(table({"runs": results}))
    if args.json:
        library = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                                  "print(MPI.Get_library_version().splitlines()[0].strip())"],
                                 capture_output=True, text=True).stdout.strip().rstrip("\x00")
        args.json.write_text(json.dumps({"library": library, "nodes": args.nodes, "rate": args.rate,
                                         "cpus_per_node": args.cpus_per_node,
                                         "train_args": args.train_args, "one_node": base,
                                         "runs": results}, indent=1))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", help="probe: default,async,tcpthread,threadN (default: default,async,"
                    "thread1,thread10); --train: none,auto,mpi,threadN (default: none,auto,mpi)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bytes", type=int, default=272_474 * 4, help="Get/Accumulate size")
    ap.add_argument("--rate", default="1gbit", help="link rate of the emulated nodes")
    ap.add_argument("--cpus-per-node", type=int, default=1,
                    help="CPUs each emulated node is bound to (0: all; netcluster.py --cpus-per-node)")
    ap.add_argument("--local", action="store_true", help="one plain mpiexec, no emulated nodes")
    ap.add_argument("--busy", choices=("numpy", "python"), default="numpy",
                    help="the target's work: NumPy GEMMs (GIL released) or pure Python (GIL held)")
    ap.add_argument("--mpiexec", help="launcher (default: the venv's mpiexec)")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--train", action="store_true",
                    help="instead: real gossip runs (python -m scalesgd) on --nodes emulated nodes, "
                         "one per mode and --variants, and their seconds per step")
    ap.add_argument("--nodes", type=int, default=3, help="--train: emulated nodes, one rank each")
    ap.add_argument("--variants", default="pull,push", help="--train: gossip variants (pull, push, "
                    "pull-ov, push-ov: overlapped)")
    ap.add_argument("--baseline", action="store_true", help="--train: also run each variant with "
                    "the same ranks on one node (compute reference)")
    ap.add_argument("--train-args", default="--epochs 1 --batch-size 32 --log-every 1",
                    help="--train: more flags for every run (default: the built-in digits)")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--poll-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank:
        rank_main(args.bytes, args.repeats, args.poll_ms, args.busy)
        return 0
    args.modes = args.modes or ",".join(TRAIN_MODES if args.train else ("default", "async", "thread1",
                                                                         "thread10"))
    return train(args) if args.train else drive(args)


def drive(args) -> int:
    import netcluster as nc                  # a sibling: benchmarks/ is sys.path[0] for a script
    modes = args.modes.split(",")
    for m in modes:
        mode_env(m)
    results = {}
    if args.local:
        results = {m: launch(args, m, None) for m in modes}
    else:
        with nc.NetCluster(2, rate=args.rate, prefix="sgdrma", cpus_per_node=args.cpus_per_node) as c:
            results = {m: launch(args, m, c) for m in modes}
    where = ("one node, plain mpiexec" if args.local else
             f"2 emulated nodes at {args.rate} ({args.cpus_per_node or 'all'} CPU(s) each)")
    print(f"rma_progress: {where}, {args.bytes} bytes, target busy {BUSY_SECONDS:g} s "
          f"({args.busy}), "
          f"origin starts after {ORIGIN_DELAY:g} s")
    for m in modes:
        print(report(m, results[m]))
    if args.json:
        args.json.write_text(json.dumps({"where": where, "bytes": args.bytes, "results": results},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
