"""Overlapped gossip (``--gossip-overlap``) against the blocking exchange, in real training runs.

    python benchmarks/gossip_overlap.py [--variants pull,push] [--epochs 2] [--repeats 1]
                                        [--ranks 4] [--nodes 0] [--rate 1gbit] [--json FILE]
                                        [--out DIR] [-- EXTRA FLAGS FOR scalesgd]

Every configuration is one real run of ``python -m scalesgd --config jobs/digits-gossip.toml`` on
RANKS ranks (the built-in digits, ResNet-20), blocking and overlapped one after the other in each
repeat.  ``--nodes N`` runs them on N emulated nodes (``netcluster.py``: network namespaces joined
by rate-limited links; root needed), RANKS / N ranks per node, each rank pinned to one core
(``taskset``): an emulated node sees every core of this machine, and scalesgd would otherwise give
each rank as many BLAS threads as the node has cores.

From the runs' metrics (each worker's last step record, the mean over ranks), per exchange:
``comm`` + ``wait`` (what the step itself spent on the exchange: all of it when blocking, the part
not hidden when overlapped), ``background`` (the courier's time on it, overlapped runs) and
``exposed`` (the part of that the step waited for).  Hidden fraction, two ways: across the pair of
runs, 1 - (comm + wait)_overlapped / (comm + wait)_blocking; within an overlapped run,
1 - exposed / background.  Plus the step time and its compute part (the machine's load
moves it), the final top-1 and the training time to 30 % and
10 % top-1 error (``summary.json``'s ``time_to_targets``).

``--mechanisms`` compares ways to take a pull read off the step, without training: RANKS ranks
(on ``--nodes`` emulated nodes, or one plain mpiexec) each run 25 steps of fixed work (GEMMs and
some Python, ~0.1 s) followed by a seqlock read of a ResNet-20-sized vector (1.09 MB) from the next
rank, done as: ``blocking`` (on the step), ``rget`` (header read on the step, the data started as a
``Rget`` and waited for at the next step, then its sequence number), ``thread-flush`` (a courier
making blocking calls: MPICH spins in ``Flush``), ``thread-poll`` (a courier with request-based
calls completed by ``MPI_Test`` and sleeps), ``thread-poll-idle`` (the same, and running MPI's
progress engine every 5 ms while idle: what ``--gossip-overlap`` does), and ``none`` (no read).
Median step time and time on the step per read, per rank.

``--idle-cost`` measures instead what the idle courier's progress polling costs the compute: RANKS
ranks (on ``--nodes`` emulated nodes, or one plain mpiexec) each time training steps of ResNet-20
(batch 16, 32x32, synthetic) in blocks, alternating no courier, a courier polling every 1 ms, and
every 5 ms; median step time
per setting, over ranks and blocks.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from scalesgd.io.runs import load_run

JOB = benchlib.ROOT / "jobs" / "digits-gossip.toml"
TARGETS = ("0.3", "0.1")          # time to these top-1 errors (keys of summary.json time_to_targets)
PIN = 'exec taskset -c $(( ${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}} % CORES )) "$@"'


def scalesgd_cmd(variant: str, overlap: bool, epochs: int, run_dir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "scalesgd", "--config", str(JOB), "--gossip", variant,
            "--epochs", str(epochs), "--progress", "off", "--run-dir", str(run_dir),
            *(["--gossip-overlap"] if overlap else []), *extra]


def run_local(cmd: list[str], ranks: int, who: str) -> None:
    benchlib.run_checked([*benchlib.mpi_launcher(ranks), *cmd], who, timeout=3600, cwd=benchlib.ROOT)


def run_cluster(cluster, cmd: list[str], who: str) -> dict:
    """One run on the emulated nodes, each rank pinned to a core; returns the bytes per node."""
    cores = len(os.sched_getaffinity(0))
    pinned = ["sh", "-c", PIN.replace("CORES", str(cores)), "sh", *cmd]
    res = cluster.run(pinned, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
                      capture=True, timeout=3600, cwd=benchlib.ROOT)
    if res.returncode != 0:
        raise SystemExit(f"{who}: failed (exit {res.returncode})\n{res.stderr[-3000:]}")
    return {n: t.sent for n, t in res.traffic.items()}


def measure(run_dir: Path) -> dict:
    """Per-exchange means over the worker ranks (ms), step time, accuracy, time to target."""
    run = load_run(run_dir)
    last = [recs[-1] for recs in run.steps.values()]
    per_ex = lambda key: statistics.mean(1e3 * r.get(key, 0.0) / max(r["gossip_exchanges"], 1)  # noqa: E731
                                         for r in last)
    summary = json.loads((run_dir / "summary.json").read_text())
    hits = {t: summary["time_to_targets"].get(t) for t in TARGETS}
    return dict(comm=per_ex("comm_seconds"), wait=per_ex("wait_seconds"),
                background=per_ex("gossip_background_seconds"),
                exposed=per_ex("gossip_exposed_seconds"),
                step=statistics.mean(1e3 * r["train_seconds"] / max(r["step"], 1) for r in last),
                compute=statistics.mean(1e3 * r["compute_seconds"] / max(r["step"], 1) for r in last),
                top1=summary["val_top1_accuracy"], train_seconds=summary["train_seconds"],
                to_target={t: None if h is None else h["train_seconds"] for t, h in hits.items()})


def hidden(blocking: dict, overlapped: dict) -> tuple[float, float | None]:
    """(across the pair: 1 - exposed / blocking exchange time, within the overlapped run)."""
    before = blocking["comm"] + blocking["wait"]
    after = overlapped["comm"] + overlapped["wait"]
    within = 1 - overlapped["exposed"] / overlapped["background"] if overlapped["background"] else None
    return 1 - after / before if before else float("nan"), within


def row(name: str, m: dict, pair: tuple | None) -> str:
    tt = "".join(f"{'-' if v is None else f'{v:.0f}':>8}" for v in m["to_target"].values())
    h = "" if pair is None else \
        f"  hidden {100 * pair[0]:5.1f} % ({100 * (pair[1] or 0):5.1f} % of background)"
    return (f"  {name:<16}{m['comm'] + m['wait']:9.1f}{m['background']:11.1f}{m['exposed']:9.1f}"
            f"{m['step']:9.0f}{m['compute']:9.0f}{100 * m['top1']:8.1f}{tt}{h}")


def fixed_work(a, reps: int) -> None:
    """~0.1 s of compute that releases the GIL (GEMMs) and holds it (Python), as a step does."""
    import numpy as np
    for _ in range(reps):
        np.dot(a, a, out=a)
        np.multiply(a, 1e-3, out=a)
        sum(i for i in range(300))


class Reader:
    """``--mechanisms``: what a step does about its read of ``peer``'s vector in one ``mode``."""

    def __init__(self, mode: str, pub, peer: int, out, courier):
        self.mode, self.pub, self.peer, self.out, self.courier = mode, pub, peer, out, courier
        self.req, self.half = None, 0

    def step(self) -> None:
        from scalesgd.comm.jobs import POLL_SECONDS
        pub, peer = self.pub, self.peer
        if self.mode == "blocking":
            pub.read(peer, self.out)
        elif self.mode == "rget":            # the data request-based; header and seq on the step
            if self.req is not None:
                self.req.Wait()
                pub.win.get(pub._s, peer, 8 * self.half)
            pub.win.get(pub._hdr, peer, 0)
            self.half = int(pub._hdr.argmax())
            self.req = pub.win.win.Rget(self.out, peer, target=pub._offset(self.half))
        elif self.mode.startswith("thread"):
            self.courier.wait()
            poll = POLL_SECONDS if self.mode.startswith("thread-poll") else None
            self.courier.submit(pub.read, peer, self.out, poll)

    def close(self) -> None:
        if self.req is not None:
            self.req.Wait()
        self.courier.close()


def mechanisms_rank(reps: int) -> None:
    """One rank of ``--mechanisms``: prints rank 0's table (per rank: median step, median ms the
    step spent on the read)."""
    import numpy as np
    from mpi4py import MPI

    from scalesgd.comm.mpi.window import Courier, PublishedVector
    comm, n = MPI.COMM_WORLD, 272_474
    pub, out = PublishedVector(comm, n, np.float32), np.empty(n, np.float32)
    pub.publish(np.full(n, comm.rank, np.float32))
    peer, a = (comm.rank + 1) % comm.size, np.random.default_rng(0).random((128, 128), np.float32)
    res = {}
    for mode in ("none", "blocking", "rget", "thread-flush", "thread-poll", "thread-poll-idle"):
        steps, on_step = [], []
        reader = Reader(mode, pub, peer, out, Courier(progress=comm.Iprobe if mode.endswith("idle")
                                                      else None))
        comm.Barrier()
        for _ in range(25):
            t0 = time.perf_counter()
            fixed_work(a, reps)
            t = time.perf_counter()
            reader.step()
            on_step.append(time.perf_counter() - t)
            steps.append(time.perf_counter() - t0)
        reader.close()
        res[mode] = (1e3 * statistics.median(steps), 1e3 * statistics.median(on_step))
    every = comm.gather(res, root=0)
    pub.free()
    if comm.rank == 0:
        print(f"gossip_overlap --mechanisms: {comm.size} ranks; per rank: median step ms "
              "(median ms of it on the read)")
        for mode in res:
            print(f"  {mode:<17}" + "".join(f"{r[mode][0]:8.0f} ({r[mode][1]:5.1f})" for r in every))


def idle_cost_rank(blocks: int, steps: int) -> None:
    """One rank of ``--idle-cost``: prints rank 0's table (medians over blocks and ranks, ms)."""
    from mpi4py import MPI

    from scalesgd.comm.mpi.window import Courier
    comm = MPI.COMM_WORLD
    runner = benchlib.OursRunner("resnet20", 10, 32, 16, seed=comm.rank)
    times: dict[str, list[float]] = {"none": [], "poll 1 ms": [], "poll 5 ms": []}
    benchlib.timed(runner, 2)                                  # warm-up
    for _ in range(blocks):
        for name, every in (("none", None), ("poll 1 ms", 0.001), ("poll 5 ms", 0.005)):
            courier = None if every is None else Courier(progress=comm.Iprobe, idle_poll=every)
            comm.Barrier()
            times[name] += benchlib.timed(runner, steps)
            if courier is not None:
                courier.close()
    every_rank = comm.gather(times, root=0)
    if comm.rank == 0:
        print(f"gossip_overlap --idle-cost: {comm.size} ranks, ResNet-20 batch 16, {blocks} blocks "
              f"of {steps} steps per setting, median step (ms):")
        base = statistics.median(t for r in every_rank for t in r["none"])
        for name in times:
            med = statistics.median(t for r in every_rank for t in r[name])
            print(f"  {name:<10}{1e3 * med:8.1f}  ({100 * (med / base - 1):+.1f} %)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="pull,push")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=0, help="emulated nodes (0: one plain mpiexec here)")
    ap.add_argument("--rate", default="1gbit", help="link rate of the emulated nodes")
    ap.add_argument("--json", type=Path, help="write every measurement here")
    ap.add_argument("--out", type=Path, help="keep the run directories here (default: a temp dir)")
    ap.add_argument("--mechanisms", action="store_true", help="compare ways to overlap a read instead")
    ap.add_argument("--work", type=int, default=500, help="--mechanisms: GEMMs per step")
    ap.add_argument("--idle-cost", action="store_true", help="measure the idle courier's cost instead")
    ap.add_argument("--blocks", type=int, default=5, help="--idle-cost: blocks per setting")
    ap.add_argument("--rank", choices=("idle", "mechanisms"), help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="more scalesgd flags, after --")
    args = ap.parse_args(argv)
    if args.rank == "idle":
        idle_cost_rank(args.blocks, 10)
        return 0
    if args.rank == "mechanisms":
        mechanisms_rank(args.work)
        return 0
    me = [sys.executable, str(Path(__file__).resolve()), "--rank"]
    if args.idle_cost:
        return launch_ranks(args, [*me, "idle", "--blocks", str(args.blocks)])
    if args.mechanisms:
        return launch_ranks(args, [*me, "mechanisms", "--work", str(args.work)])
    results = train_runs(args, args.out or Path(tempfile.mkdtemp(prefix="gossip_overlap.")))
    report(args, results)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "runs": results}, indent=1))
    return 0


def train_runs(args, out: Path) -> dict:
    """Blocking and overlapped runs of each variant, REPEATS times; their measurements by name."""
    cluster = None
    if args.nodes:
        import netcluster as nc                       # a sibling: benchmarks/ is sys.path[0]
        if args.ranks % args.nodes:
            raise SystemExit("gossip_overlap: --ranks must be a multiple of --nodes")
        cluster = nc.NetCluster(args.nodes, rate=args.rate, ranks_per_node=args.ranks // args.nodes,
                                prefix="sgdovl")
    results = {}
    with cluster if cluster is not None else _null():
        for rep in range(args.repeats):
            for variant in args.variants.split(","):
                for overlap in (False, True):
                    name = f"{variant}-{'overlap' if overlap else 'blocking'}-{rep}"
                    cmd = scalesgd_cmd(variant, overlap, args.epochs, out / name, args.extra)
                    print(f"gossip_overlap: {name} ...", flush=True)
                    if cluster is None:
                        run_local(cmd, args.ranks, name)
                        sent = None
                    else:
                        sent = run_cluster(cluster, cmd, name)
                    results[name] = {**measure(out / name), "bytes_sent": sent}
    return results


def launch_ranks(args, cmd: list[str]) -> int:
    """Runs a ``--rank`` mode on RANKS ranks (on ``--nodes`` emulated nodes, or one mpiexec here)
    and prints what rank 0 printed."""
    if not args.nodes:
        print(benchlib.run_checked([*benchlib.mpi_launcher(args.ranks), *cmd], "gossip_overlap",
                                   3600).stdout, end="")
        return 0
    import netcluster as nc
    with nc.NetCluster(args.nodes, rate=args.rate, ranks_per_node=args.ranks // args.nodes,
                       prefix="sgdovl") as cluster:
        res = cluster.run(cmd, env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
                          capture=True, timeout=3600, cwd=benchlib.ROOT)
    if res.returncode:
        raise SystemExit(f"gossip_overlap: failed (exit {res.returncode})\n{res.stderr[-3000:]}")
    print(f"({args.nodes} emulated nodes at {args.rate})")
    print(res.stdout, end="")
    return 0


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def report(args, results: dict) -> None:
    where = (f"{args.nodes} emulated nodes at {args.rate}, {args.ranks // args.nodes} rank(s) each"
             if args.nodes else "one node (shared memory)")
    print(f"gossip_overlap: {args.ranks} ranks, {where}, {args.epochs} epochs of the digits job")
    print(f"  {'run':<16}{'exch. ms':>9}{'backgr. ms':>11}{'exp. ms':>9}{'step ms':>9}{'comp. ms':>9}"
          f"{'top-1':>8}"
          + "".join(f"{'s@' + t:>8}" for t in TARGETS)
          + "   (per exchange: comm + wait on the step, courier, waited for; s@E: seconds to error E)")
    for name, m in results.items():
        pair = None
        if "-overlap-" in name:
            pair = hidden(results[name.replace("-overlap-", "-blocking-")], m)
        print(row(name, m, pair))


if __name__ == "__main__":
    sys.exit(main())
