"""Communication cost of each method's exchange on a ResNet-50-sized flat buffer, against raw
``MPI.Allreduce`` of the same buffer and a plain memory copy (the ceiling), measured side by side.

    python benchmarks/comm.py [--ranks 2 4] [--floats 25557032] [--repeats 7] [--json OUT]

The driver launches ``mpiexec -n P python benchmarks/comm.py --worker`` for each P (``$MPIEXEC`` and
``$MPIEXEC_ARGS`` choose the launcher, as for the tests); the ranks time
every operation in interleaved rounds (so placement noise hits all alike) and rank 0 prints medians,
ratios to raw all-reduce, and bus bandwidth 2(p-1)/p * bytes / time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from benchlib import Probe, fmt_probe, mpi_launcher, run_checked


# ----------------------------------------------------------------------------- worker side
def fake_layout(n_floats: int, n_tensors: int = 161):
    """A layout with ResNet-50's tensor count and total size (sizes vary like a real network)."""
    from scalesgd.nn.params import Layout, TensorSpec
    rng = np.random.default_rng(0)
    w = rng.pareto(1.0, n_tensors) + 0.01
    sizes = np.maximum(1, (w / w.sum() * n_floats).astype(np.int64))
    sizes[-1] += n_floats - sizes.sum()
    return Layout([TensorSpec(f"t{i}", (int(s),)) for i, s in enumerate(sizes)])


def ops(comm, n_floats: int) -> dict:
    """name -> zero-argument callable doing one exchange (same on every rank, collective)."""
    from mpi4py import MPI

    from scalesgd.comm.mpi.buckets import BucketedAllreduce
    layout = fake_layout(n_floats)
    buf = np.random.default_rng(comm.rank).standard_normal(n_floats).astype(np.float32)
    dst = np.empty_like(buf)
    table = {
        "memcpy (ceiling)": lambda: np.copyto(dst, buf),
        "MPI.Allreduce raw": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
    }
    for mb, overlap in ((25, False), (25, True), (0, False)):
        red = BucketedAllreduce(comm, buf, layout, int(mb * 1e6), overlap)

        def bucketed(red=red):
            for spec in reversed(layout.specs):
                red.ready([spec.name])
            red.finish()
        label = f"allreduce bucketed {mb} MB" if mb else "allreduce one bucket"
        table[label + (" overlap" if overlap else "")] = bucketed
    table.update(server_ops(comm, buf))
    table.update(gossip_ops(comm, buf))
    return table


def server_ops(comm, buf) -> dict:
    """One exchange of every worker with the server (rank 0), as easgd/asgd do it: workers push the
    flat buffer and wait for a params-sized reply; the server serves them in arrival order and
    applies the update in place (easgd: elastic step; asgd: add).  Time = all workers served once."""
    from scalesgd.comm.mpi.protocol import ServerPort, WorkerPort
    from scalesgd.comm.wire import PushHeader, header
    reply, center = np.empty_like(buf), buf.copy()
    if comm.rank == 0:
        port = ServerPort(comm)

        def serve(kind):
            for _ in range(comm.size - 1):
                src = port.recv_push_header()
                port.recv_push_payload(src, reply)
                if kind == "easgd":                      # reply with the old center, then update it
                    port.send_reply(src, center)
                    np.subtract(reply, center, out=reply)
                    np.multiply(reply, 0.8 / (comm.size - 1), out=reply)
                    np.add(center, reply, out=center)
                else:                                    # asgd: apply the pushed update, reply
                    np.add(center, reply, out=center)
                    port.send_reply(src, center)
        return {"easgd exchange (all workers once)": lambda: serve("easgd"),
                "asgd push+fetch (all workers once)": lambda: serve("asgd")}
    port, hdr = WorkerPort(comm), header(PushHeader.SIZE)

    def exchange():
        port.post_reply(reply)
        port.send_push(hdr, buf)
        port.finish_push()
        port.wait_reply()
    return {"easgd exchange (all workers once)": exchange, "asgd push+fetch (all workers once)": exchange}


_WINDOWS: list = []      # freed (collectively) when the measurements are done


def gossip_ops(comm, buf) -> dict:
    """gossip: every rank pulls a peer's published copy (seqlock Get), or pushes half its push-sum
    state with Accumulate and drains its own inbox, at the same time."""
    from scalesgd.comm.mpi.inbox import Inbox
    from scalesgd.comm.mpi.window import PublishedVector
    pub = PublishedVector(comm, buf.size, buf.dtype)
    pub.publish(buf)
    inbox = Inbox(comm, buf.size + 1, buf.dtype)
    peer, tmp = np.empty_like(buf), np.zeros(buf.size + 1, buf.dtype)
    msg = np.concatenate([buf * 0.5, [0.5]]).astype(buf.dtype)
    nxt = (comm.rank + 1) % comm.size
    _WINDOWS.extend([pub, inbox])
    comm.Barrier()

    def pull():
        pub.read(nxt, peer)
        pub.publish(buf)

    def push():
        inbox.push(nxt, msg)
        inbox.drain(tmp)
    return {"gossip pull (Get + publish)": pull, "gossip push (Accumulate + drain)": push}


def worker(args) -> None:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    table = ops(comm, args.floats)
    times: dict[str, list[float]] = {k: [] for k in table}
    for _ in range(args.warmup):
        for fn in table.values():
            fn()
    for _ in range(args.repeats):                # interleaved rounds
        for name, fn in table.items():
            comm.Barrier()
            t = time.perf_counter()
            fn()
            dt = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            times[name].append(dt)
    for w in _WINDOWS:
        w.free()
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "floats": args.floats, "times": times}), flush=True)


# ----------------------------------------------------------------------------- driver side
def report(res: dict) -> list[dict]:
    p, nbytes = res["ranks"], res["floats"] * 4
    base = float(np.median(res["times"]["MPI.Allreduce raw"]))
    rows = []
    for name, ts in res["times"].items():
        med = float(np.median(ts))
        rows.append(dict(ranks=p, op=name, median_ms=1e3 * med, best_ms=1e3 * min(ts),
                         ratio_to_raw=med / base, bus_GBps=2 * (p - 1) / p * nbytes / med / 1e9))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--floats", type=int, default=25_557_032)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        try:
            worker(args)
        except BaseException:
            import traceback
            traceback.print_exc()
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(1)          # never leave the other ranks waiting
        return 0
    probe = Probe()
    all_rows, probes = [], [fmt_probe(probe.run())]
    for p in args.ranks:
        cmd = [*mpi_launcher(p), sys.executable, __file__, "--worker", "--floats", str(args.floats),
               "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
        out = run_checked(cmd, f"comm: {p} ranks", 900)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith('{"ranks"')][-1]
        all_rows += report(json.loads(line))
        probes.append(fmt_probe(probe.run()))
    print(f"buffer {args.floats:,} float32 ({args.floats * 4 / 1e6:.1f} MB); medians of {args.repeats} "
          f"interleaved rounds; c2c probe per launch: {' / '.join(probes)}")
    print(f"{'ranks':>5}  {'operation':<36} {'median ms':>10} {'best ms':>9} {'x raw':>7} {'bus GB/s':>9}")
    for r in all_rows:
        print(f"{r['ranks']:>5}  {r['op']:<36} {r['median_ms']:>10.1f} {r['best_ms']:>9.1f} "
              f"{r['ratio_to_raw']:>7.3f} {r['bus_GBps']:>9.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": all_rows, "probes": probes}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
