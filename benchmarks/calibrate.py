"""Measures the constants of the cost model (``python -m scalesgd.costmodel``) on this machine.

    python benchmarks/calibrate.py [--ranks 2 4 8] [--json results/calibration-cpu.json]

1. **compute**: one training step (forward, backward, Nesterov update) of ResNet-20 at 32x32 for
   batch 8 and 16, one thread, in this process: median of 15 timed steps after 3 warm-up steps;
   one gossip mixing pass per size; and the **end-to-end** seconds per step of a real one-rank
   1-epoch run on the digits (data loading and logging included), batch 8 and 16; and the
   **contended** compute step when R single-threaded processes run at once (R = 1 and each rank
   count), which is how oversubscription stretches compute on this machine; and the seconds per
   batch of the DALI loader alone with one thread (decode + augmentation, no training).
2. **allreduce** (``mpiexec -n P``): median time of ``MPI.Allreduce`` (SUM, float32) for sizes
   1 KB .. 4 MB (the slowest rank's time).
3. **get**: one pull of the gossip protocol (``PublishedVector.read``, one-sided Get under
   ``Lock_all(NOCHECK)``) of a random peer, every rank pulling at once, sizes 1 KB .. 4 MB.
4. **accumulate**: one push-sum message (``Inbox.push``: ``Accumulate(SUM)``) into a random peer.
5. **server**: rank 0 serves exchanges the way ``ServerMethod`` does (receive a header and the whole
   vector from any worker, add it to its own, send the vector back); the workers exchange back to
   back with no compute, so the server is saturated: service time per exchange = 1 / exchanges per
   second.  With P = 2 (one worker) it is the unloaded round trip.

The driver writes one JSON file; the model fits latency/bandwidth from it (``scalesgd.costmodel.cost``).
Intra-node MPI timings on this machine are bimodal (the host moves the two vCPUs between placements
that share an L3 and placements that do not, every few tens of seconds; 64 KB-4 MB messages vary 2-5x
between runs, measured on a 2-core development machine, 2026-11-29): medians of
interleaved repeats, and the core-to-core probe is recorded with them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import ROOT, Probe, fmt_probe, mpi_launcher, rank_env, run_checked

SIZES = [256 * 4 ** k for k in range(7)]          # floats: 1 KB .. 4 MB
REPEATS = 9


def step_seconds(batch: int, steps: int = 15, warmup: int = 3) -> tuple[list[float], int]:
    """Seconds of each of ``steps`` training steps (forward, backward, Nesterov update) of ResNet-20
    at 32x32 on one thread, after ``warmup`` untimed steps; and the model's parameter count."""
    from threadpoolctl import threadpool_limits  # noqa: PLC0415

    from scalesgd import config as C  # noqa: PLC0415
    from scalesgd.nn.resnet import ResNet  # noqa: PLC0415
    from scalesgd.optim.sgd import SGD  # noqa: PLC0415
    from scalesgd.train.step import train_step  # noqa: PLC0415
    with threadpool_limits(1):
        model = ResNet("resnet20", 10, 1.0, False, np, "float32", seed=0)
        opt = SGD(model.ps.params, C.build().optim, model.ps.decay_mask())
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 32, 32, 3)).astype(np.float32)
        y = rng.integers(0, 10, batch)
        ts = []
        for i in range(steps + warmup):
            t = time.perf_counter()
            train_step(model, x, y, 0.0, 1.0)
            opt.step(model.ps.params, model.ps.grads, 0.01)
            if i >= warmup:
                ts.append(time.perf_counter() - t)
    return ts, model.num_params


def compute_times() -> dict:
    out = {}
    for batch in (8, 16):
        ts, n = step_seconds(batch)
        out[f"resnet20_b{batch}"] = dict(seconds=float(np.median(ts)), num_params=n,
                                         spread=[float(min(ts)), float(max(ts))])
    from scalesgd.methods import mixing  # noqa: PLC0415
    mix = {}
    for n in SIZES[3:]:                            # one gossip mixing pass x <- (x + y) / 2
        x, y = np.ones(n, np.float32), np.ones(n, np.float32)
        ts = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            mixing.pull_mix(x, y, 0.5)
            ts.append(time.perf_counter() - t)
        mix[str(n * 4)] = float(np.median(ts))
    out["mix"] = mix
    return out


def compute_worker(out: Path, steps: int = 20) -> None:
    """One of R concurrent processes: median seconds of a ResNet-20 batch-16 step (1 thread)."""
    out.write_text(json.dumps(float(np.median(step_seconds(16, steps)[0]))))


def contended_compute(ranks: list[int]) -> dict:
    """Seconds per compute step when R single-threaded processes share the machine (R = 1 and each
    rank count): how oversubscription stretches compute, measured without any communication."""
    res = {}
    for r in sorted({1, *ranks}):
        outs = [Path(f"/tmp/scalesgd-contended-{os.getpid()}-{r}-{i}.json") for i in range(r)]
        procs = [subprocess.Popen([sys.executable, __file__, "--compute-worker", str(o)], env=rank_env(),
                                  stdin=subprocess.DEVNULL) for o in outs]
        if any(p.wait(timeout=600) for p in procs):
            raise SystemExit("calibrate: a contended-compute process failed")
        vals = [json.loads(o.read_text()) for o in outs]
        for o in outs:
            o.unlink()
        res[str(r)] = float(np.median(vals))
        print(f"contended compute: {r} processes: {1e3 * res[str(r)]:.1f} ms/step", flush=True)
    return res


def data_seconds(batch: int = 16) -> float:
    """Seconds per training batch of the DALI loader alone on the digits with one thread (no
    training): the decode and augmentation work a rank does per step.  In a one-rank run it overlaps
    the compute on the idle second core; once every core runs a rank, it is CPU time of its own."""
    from scalesgd.data.demo import build_digits, default_data_dir  # noqa: PLC0415
    from scalesgd.data.pipeline import Loader  # noqa: PLC0415
    from scalesgd.data.shards import ShardSet  # noqa: PLC0415
    root = default_data_dir(32)
    build_digits(root, 32)
    ld = Loader(ShardSet.open(root, "train"), train=True, batch_size=batch, image_size=32,
                augment="multiscale", scale=(32.0, 40.0), flip=False, num_threads=1, seed=0)
    for _ in ld.epoch(0):                     # warm-up epoch (pipeline build, first decode)
        pass
    t, n = time.perf_counter(), 0
    for e in (1, 2):
        for _ in ld.epoch(e):
            n += 1
    return (time.perf_counter() - t) / n


def end_to_end_step(batch: int = 16) -> dict:
    """Seconds per step of a real one-rank run (data loading, step, logging: everything the
    experiment runs do per step), from a 1-epoch ``single`` run on the digits."""
    from sweeps.runner import JOB  # noqa: PLC0415

    from scalesgd.io.runs import load_run  # noqa: PLC0415
    run_dir = Path(f"/tmp/scalesgd-calibrate-single-{os.getpid()}")
    cmd = [*mpi_launcher(1), sys.executable, "-m", "scalesgd", "--config", str(JOB),
           "--method", "single", "--epochs", "1", "--batch-size", str(batch), "--run-dir", str(run_dir)]
    run_checked(cmd, "calibrate: end-to-end run", 600)
    recs = load_run(run_dir).steps[0]
    per = (recs[-1]["train_seconds"] - recs[0]["train_seconds"]) / (len(recs) - 1)
    last = recs[-1]
    import shutil  # noqa: PLC0415
    shutil.rmtree(run_dir, ignore_errors=True)
    return dict(seconds=per, steps=len(recs), data_fraction=last["data_seconds"] / last["train_seconds"])


# ----------------------------------------------------------------------------- MPI side
def _timer(comm):
    """``timed(fn, reps)``: the median over ``reps`` of the slowest rank's seconds for ``fn()``
    (every repeat starts at a barrier)."""
    from mpi4py import MPI  # noqa: PLC0415

    def timed(fn, reps=REPEATS):
        ts = []
        for _ in range(reps):
            comm.Barrier()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        worst = np.empty(reps)
        comm.Allreduce(np.array(ts), worst, op=MPI.MAX)      # the slowest rank's time per repeat
        return float(np.median(worst))
    return timed


def _one_sided(comm, rng, timed) -> dict:
    """Seconds per gossip exchange by bytes: ``get`` (a pull of a published vector from a random
    peer) and ``accumulate`` (push-sum: Accumulate(SUM) into a random peer's inbox)."""
    from scalesgd.comm.mpi.inbox import Inbox  # noqa: PLC0415
    from scalesgd.comm.mpi.window import PublishedVector  # noqa: PLC0415
    p, rank = comm.size, comm.rank
    res = {"get": {}, "accumulate": {}}
    for n in SIZES:
        pub = PublishedVector(comm, n, np.float32)
        pub.publish(np.full(n, rank, np.float32))
        buf = np.empty(n, np.float32)
        comm.Barrier()
        peers = [int(j) for j in rng.integers(0, p - 1, 32)]

        def pulls(k=8):
            for j in peers[:k]:
                pub.read(j if j < rank else j + 1, buf)
        res["get"][str(n * 4)] = timed(pulls, 5) / 8
        comm.Barrier()
        pub.free()
    for n in SIZES[3:]:
        box = Inbox(comm, n, np.float32)
        msg = np.ones(n, np.float32)
        comm.Barrier()
        peers = [int(j) for j in rng.integers(0, p - 1, 8)]

        def pushes():
            for j in peers:
                box.push(j if j < rank else j + 1, msg)
        res["accumulate"][str(n * 4)] = timed(pushes, 5) / 8
        comm.Barrier()
        box.free()
    return res


def _server(comm) -> dict:
    """Seconds per exchange a rank-0 server serves (header, push, reply) by bytes, every other rank
    a worker exchanging as fast as it can."""
    from mpi4py import MPI  # noqa: PLC0415
    p, rank, res = comm.size, comm.rank, {}
    for n in (SIZES[4], SIZES[5], SIZES[6]):       # 256 KB, 1 MB, 4 MB... the server's exchange
        x, rx = np.zeros(n, np.float32), np.empty(n, np.float32)
        hdr = np.zeros(6, np.int64)
        exchanges = 40 if n <= SIZES[5] else 16
        comm.Barrier()
        t = time.perf_counter()
        if rank == 0:
            st = MPI.Status()
            for _ in range(exchanges * (p - 1)):
                comm.Recv([hdr, MPI.INT64_T], source=MPI.ANY_SOURCE, tag=1, status=st)
                w = st.Get_source()
                comm.Recv([rx, MPI.FLOAT], source=w, tag=2)
                x += rx
                comm.Send([x, MPI.FLOAT], dest=w, tag=3)
        else:
            d = np.ones(n, np.float32)
            for _ in range(exchanges):
                comm.Send([hdr, MPI.INT64_T], dest=0, tag=1)
                comm.Send([d, MPI.FLOAT], dest=0, tag=2)
                comm.Recv([rx, MPI.FLOAT], source=0, tag=3)
        el = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
        res[str(n * 4)] = el / (exchanges * (p - 1))     # seconds per exchange served
    return res


def worker(json_out: Path) -> None:
    """One rank of a calibration launch: the all-reduce, one-sided and server tables at this rank
    count; rank 0 writes them to ``json_out``."""
    from mpi4py import MPI  # noqa: PLC0415
    comm = MPI.COMM_WORLD
    timed = _timer(comm)
    res = {"allreduce": {}}
    for n in SIZES:
        a, b = np.ones(n, np.float32), np.empty(n, np.float32)
        res["allreduce"][str(n * 4)] = timed(lambda: comm.Allreduce(a, b, op=MPI.SUM))
    res.update(_one_sided(comm, np.random.default_rng(comm.rank), timed))
    res["server"] = _server(comm)
    if comm.rank == 0:
        json_out.write_text(json.dumps(dict(ranks=comm.size, **res)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4, 5, 8, 9])
    ap.add_argument("--json", type=Path, default=ROOT / "results" / "calibration-cpu.json")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compute-worker", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    if a.compute_worker:
        compute_worker(a.compute_worker)
        return 0
    t0, probe = time.perf_counter(), Probe()
    out = dict(machine=f"{os.cpu_count()} cores (this CI-sized machine)", cores=os.cpu_count(),
               date=time.strftime("%Y-%m-%d"),
               probe_before=fmt_probe(probe.run()), compute=compute_times(), mpi={})
    out["end_to_end"] = {"resnet20_b16": end_to_end_step(16), "resnet20_b8": end_to_end_step(8)}
    out["contended_compute"] = contended_compute(a.ranks)
    out["data_seconds"] = {"resnet20_b16": data_seconds(16), "resnet20_b8": data_seconds(8)}
    print("data loading per batch:", json.dumps(out["data_seconds"]), flush=True)
    print("compute:", json.dumps(out["compute"]), "end to end:", json.dumps(out["end_to_end"]))
    for p in a.ranks:
        tmp = Path(f"/tmp/scalesgd-calibrate-{os.getpid()}-{p}.json")
        run_checked([*mpi_launcher(p), sys.executable, __file__, "--worker", str(tmp)],
                    f"calibrate: {p} ranks", 600)
        out["mpi"][str(p)] = json.loads(tmp.read_text())
        tmp.unlink()
        m = out["mpi"][str(p)]
        print(f"p={p}: allreduce 1MB {1e3 * m['allreduce'][str(4 * 262144)]:.2f} ms, "
              f"get 1MB {1e3 * m['get'][str(4 * 262144)]:.2f} ms, "
              f"server 1MB {1e3 * m['server'][str(4 * 262144)]:.2f} ms/exchange", flush=True)
    out["probe_after"] = fmt_probe(probe.run())
    out["seconds"] = time.perf_counter() - t0
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.json} ({out['seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
