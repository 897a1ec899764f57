"""``scalesgd doctor``: what a user runs first on a new machine or cluster, under the same launcher
as a training job (``mpiexec -n N`` / ``srun``), before spending a large allocation.

Every rank takes part; rank 0 prints one table, a row per check with its status (``ok``, ``warn``,
``fail``, ``n/a``) and, unless ok, a one-line fix, and writes the same rows as JSON (``--json``,
default ``RUN_DIR/doctor.json``).  The exit status is 1 when any row failed (or the JSON could not be
written), else 0.  The checks, in order (every rank calls every check, in this order, since some
are collectives):

- the MPI library mpi4py loaded, the launch (``comm/probe.start``: a launch that made every rank a
  singleton is a failed row, not a refusal) and the ranks per node against the launcher's promise;
- all-reduce bus bandwidth within a node and across nodes, next to a memory copy's;
- one-sided progress: Get / Accumulate / Fetch_and_op while the target computes outside MPI;
- CuPy and the CUDA driver, the rank -> GPU mapping, NCCL, CUDA-aware MPI, cuDNN Frontend, the
  fast paths; DALI decode of one JPEG on the CPU and on the GPU;
- the shard directory (``--data``) and free disk in the run directory.

The GPU branches (``gpu_facts``, ``check_nccl``, ``check_cuda_aware_mpi``'s transfer,
``check_cudnn_frontend``, ``kernel_checks``, ``_decode_on_node`` with a device) are plain CuPy /
DALI calls that have NEVER RUN ON A GPU; on a machine without one those rows read
n/a with the reason.  A deadline (``--deadline``) ends the job naming the check that hung.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

OK, WARN, FAIL, NA = "ok", "warn", "fail", "n/a"
RMA_WAITED = 0.25          # an RMA latency above this fraction of the target's compute time = waited
INTRA_MIN_FRACTION = 0.05  # intra-node all-reduce bus bandwidth below this share of a memory copy: warn
NETWORK_MIN_GBS = 1.0      # across nodes below this (10 Gbit/s Ethernet): warn
DISK_FAIL_GB, DISK_WARN_GB = 1.0, 10.0
DECODED_PER_SHARD = 4      # samples strictly decoded at the start of every shard


@dataclass
class Check:
    """One row of the table (and of doctor.json): ``fix`` is empty exactly when ``status`` is ok."""

    name: str
    status: str
    result: str
    fix: str = ""
    data: dict = field(default_factory=dict)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, printed by the launcher's rank 0 only (MPI has not started yet)."""
        if _launcher_rank() == 0:
            print(f"scalesgd doctor: error: {message} (see --help)", file=sys.stderr, flush=True)
        self.exit(2)


def make_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="scalesgd doctor", description="Check this machine or cluster before "
                 "training: MPI and the launcher, all-reduce bandwidth, one-sided progress, GPUs, "
                 "DALI, the data set and the run directory (run it under the job's launcher).")
    ap.add_argument("--data", metavar="DIR", help="shard directory to check (readable on every node, "
                    "checksums, a few samples decoded)")
    ap.add_argument("--run-dir", metavar="DIR", default="runs", help="directory runs will write to: "
                    "free disk and write access (default: runs)")
    ap.add_argument("--json", metavar="FILE", help="where to write the rows as JSON "
                    "(default: RUN_DIR/doctor.json)")
    # Test-only knobs: smaller and shorter than the defaults the checks are meant to run with.
    ap.add_argument("--allreduce-mb", type=float, default=25.0, help=argparse.SUPPRESS)
    ap.add_argument("--busy-seconds", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=300.0, help=argparse.SUPPRESS)
    return ap


def _launcher_rank() -> int:
    """The rank the launcher's environment gives this process (0 without a launcher)."""
    from .comm.topology import LAUNCHER_VARS
    for _, rank_var, _, _ in LAUNCHER_VARS:
        if os.environ.get(rank_var, "").isdigit():
            return int(os.environ[rank_var])
    return 0


# ----------------------------------------------------------------------------- the run
class Ctx:
    """What every check gets: the arguments, how MPI came up, and where this rank is.  Every rank
    runs every check and gets a row back; only rank 0's rows are reported, so a row may rest on what
    rank 0 alone measured."""

    def __init__(self, args, start, deadline: "_Deadline"):
        from .comm import probe
        self.args, self.start, self.topo, self.deadline = args, start, start.topo, deadline
        self.rank = self.topo.rank if self.topo else 0
        self.size = self.topo.size if self.topo else 1
        self.local_rank = self.topo.local_rank if self.topo else 0
        self.nodes = probe.node_ids(self.topo) if self.topo else np.zeros(1, np.int64)   # (size,)
        self.gpus: list[dict] | None = None      # every rank's gpu_facts, once check_cupy_cuda ran

    @property
    def num_nodes(self) -> int:
        return len(set(self.nodes.tolist()))

    def gather(self, obj) -> list:
        """Collective: every rank's JSON-able ``obj``, in rank order (as text, no pickle)."""
        if self.topo is None:
            return [obj]
        from .comm.collectives import allgather_text
        return [json.loads(t) for t in allgather_text(self.topo.comm, json.dumps(obj))]

    def on_leaders(self, fn) -> list:
        """Collective: ``fn()`` run by each node's local rank 0, gathered: one result per node."""
        mine = fn() if self.local_rank == 0 else None
        return [r for r in self.gather(mine) if r is not None]


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    from .comm import probe
    t0, deadline = time.monotonic(), _Deadline(args.deadline)
    start = probe.start()
    if start.quiet:
        return 1
    deadline.topo = start.topo
    ctx = Ctx(args, start, deadline)
    checks = [_run(ctx, name, fn) for name, fn in CHECKS]
    deadline.cancel()
    failed = any(c.status == FAIL for c in checks)
    if ctx.rank == 0:
        failed |= not _report(ctx, checks, time.monotonic() - t0)
    if ctx.topo is not None:
        failed = bool(probe.bcast_int(ctx.topo, int(failed)))
    return 1 if failed else 0


def _run(ctx: Ctx, name: str, fn) -> Check:
    """One check; an exception is its failed row (a bug in the check, or an environment it did not
    foresee), not the end of the doctor."""
    ctx.deadline.step = name
    try:
        return fn(ctx, name)
    except Exception as exc:       # noqa: BLE001 - reported as the row
        return Check(name, FAIL, f"unexpected {type(exc).__name__}: {' '.join(str(exc).split())}",
                     "report this with doctor.json: the check itself failed")


class _Deadline:
    """After ``seconds``, names the step that hung and ends every rank: the doctor never hangs, even
    in MPI_Init or in a collective that a dead rank or network will never complete."""

    def __init__(self, seconds: float):
        self.seconds, self.step, self.topo = seconds, "starting MPI", None
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        where = f" (rank {self.topo.rank}/{self.topo.size})" if self.topo is not None else ""
        print(f"scalesgd doctor: error{where}: '{self.step}' did not finish within {self.seconds:g} s "
              "(a rank or the network stopped answering); ending the job", file=sys.stderr, flush=True)
        if self.topo is not None and self.topo.size > 1:
            from .comm import probe
            probe.abort(self.topo, 1)
        os._exit(1)

    def cancel(self) -> None:
        self.timer.cancel()


def _report(ctx: Ctx, checks: list[Check], seconds: float) -> bool:
    """Rank 0: the table on stdout and the JSON file; False when the file could not be written."""
    from ._version import version
    path = Path(ctx.args.json) if ctx.args.json else Path(ctx.args.run_dir) / "doctor.json"
    doc = {"format": "scalesgd-doctor", "format_version": 1, "scalesgd": version(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 2),
           "ranks": ctx.size, "nodes": ctx.num_nodes, "host": socket.gethostname(),
           "ok": not any(c.status == FAIL for c in checks), "checks": [asdict(c) for c in checks]}
    problem = _write_json(path, doc)
    print(render(checks, f"scalesgd doctor {version()}: {ctx.size} rank{'s' * (ctx.size > 1)} on "
                         f"{ctx.num_nodes} node{'s' * (ctx.num_nodes > 1)}, {seconds:.1f} s"), flush=True)
    if problem:
        print(f"scalesgd doctor: error: cannot write {path} ({problem})", file=sys.stderr, flush=True)
    else:
        print(f"rows written to {path}", flush=True)
    return not problem


def _write_json(path: Path, doc: dict) -> str:
    """Writes ``doc`` atomically (creating the directory); '' or why it could not."""
    from .io.files import write_json_atomic
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, doc)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def render(checks: list[Check], header: str) -> str:
    """The table: ``name  status  result`` per row, then ``fix: ...`` under every row not ok."""
    w = max(len(c.name) for c in checks)
    lines = [header, f"{'check':<{w}}  {'status':<6}  result"]
    for c in checks:
        lines.append(f"{c.name:<{w}}  {c.status:<6}  {c.result}")
        if c.fix:
            lines.append(f"{'':<{w}}  {'':<6}  fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL, NA)}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- MPI and the launch
def check_mpi_library(ctx: Ctx, name: str) -> Check:
    from .comm import topology
    lib = ctx.start.library
    if not lib:
        return Check(name, FAIL, ctx.start.problem, "install an MPI where mpi4py finds it: "
                     "pip install mpich (or load the cluster's MPI module and reinstall mpi4py)")
    lib_name = topology.library_name(lib)
    device = next((ln.split(":", 1)[1].strip() for ln in lib.splitlines()
                   if ln.startswith("MPICH Device")), "")                 # MPICH's netmods
    names = sorted(set(ctx.gather(lib_name)))
    if len(names) > 1:
        return Check(name, FAIL, f"the ranks load different MPI libraries: {', '.join(names)}",
                     "use the same environment (venv, MPI module) on every node")
    from .comm import probe
    level = f"thread level {probe.thread_level()}" if ctx.topo else "MPI not started"
    return Check(name, OK, f"{lib_name}{f' ({device})' if device else ''} through mpi4py "
                 f"{probe.mpi4py_version()}, {level}",
                 data={"library": lib.strip().splitlines()[0], "thread_level": level})


def check_launcher(ctx: Ctx, name: str) -> Check:
    from .comm import topology
    promise = next(((var, os.environ[var], who) for var, _, who, _ in topology.LAUNCHER_VARS
                    if os.environ.get(var)), None)
    data = {"mpi_size": ctx.size, "launcher_size": topology.launched_size(),
            "launcher_var": promise[0] if promise else None}
    if ctx.start.problem:
        result, _, fix = ctx.start.problem.partition("; ")
        return Check(name, FAIL, result, fix or "the launcher and the library mpi4py loads must be "
                     "the same MPI (the result says how)", data)
    said = f"as {promise[0]}={promise[1]} ({promise[2]}) promised" if promise else \
        "no launcher variables (started without a launcher)"
    return Check(name, OK, f"{ctx.size} rank{'s' * (ctx.size > 1)} in MPI_COMM_WORLD on "
                 f"{ctx.num_nodes} node{'s' * (ctx.num_nodes > 1)}, {said}", data=data)


# Where launchers say how many ranks they put on this node (nearest launcher first: MPICH's mpiexec
# inside a Slurm job starts one proxy per node through srun, so its own variable must win).
LOCAL_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE")


def slurm_tasks_on_node(spec: str, node_id: int) -> int | None:
    """SLURM_STEP_TASKS_PER_NODE ('4(x2),3': 4, 4, 3) at index SLURM_NODEID; None if unreadable."""
    counts = []
    for part in spec.split(","):
        n, _, rep = part.partition("(x")
        if not n.isdigit() or (rep and not rep.rstrip(")").isdigit()):
            return None
        counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def _local_promise() -> tuple[str, int] | None:
    for var in LOCAL_VARS:
        value = os.environ.get(var)
        if value is None:
            continue
        if var.startswith("SLURM"):
            n = slurm_tasks_on_node(value, int(os.environ.get("SLURM_NODEID", "0") or 0))
        else:
            n = int(value) if value.isdigit() else None
        return (var, n) if n is not None else None
    return None


def check_ranks_per_node(ctx: Ctx, name: str) -> Check:
    local_size = ctx.topo.local_size if ctx.topo else 1
    mine = {"node": int(ctx.nodes[ctx.rank]), "host": socket.gethostname(), "promise": _local_promise(),
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else
            list(range(os.cpu_count() or 1))}
    ranks = ctx.gather(mine)
    nodes, warnings, fixes = _per_node(ranks), [], []
    for nd in nodes:
        if nd["promise"] and nd["promise"][1] != nd["ranks"]:
            warnings.append(f"{nd['host']}: the launcher put {nd['promise'][1]} ranks there "
                            f"({nd['promise'][0]}), MPI's shared-memory split has {nd['ranks']}")
            fixes.append("the launcher's and MPI's idea of a node differ (containers? hostnames?)")
        if nd["ranks"] > nd["cores"]:
            warnings.append(f"{nd['host']}: {nd['ranks']} ranks on {nd['cores']} cores")
            fixes.append("start at most one rank per core (timings below are pessimistic)")
    shown = "; ".join(f"{nd['host']}: {nd['ranks']} rank{'s' * (nd['ranks'] > 1)}, {nd['cores']} "
                      f"core{'s' * (nd['cores'] > 1)}" for nd in nodes[:4])
    shown += f"; and {len(nodes) - 4} more nodes" if len(nodes) > 4 else ""
    data = {"nodes": nodes, "mpi_local_size": local_size}
    if warnings:
        warnings = list(dict.fromkeys(warnings))          # nodes alike say it once
        return Check(name, WARN, "; ".join(warnings[:3]), fixes[0], data)
    return Check(name, OK, shown, data=data)


def _per_node(ranks: list[dict]) -> list[dict]:
    """Rank facts grouped by node: host, rank count, the cores their affinities cover, the promise."""
    nodes: dict[int, dict] = {}
    for r in ranks:
        nd = nodes.setdefault(r["node"], {"host": r["host"], "ranks": 0, "cores": set(),
                                          "promise": r["promise"]})
        nd["ranks"] += 1
        nd["cores"].update(r["cores"])
    return [dict(nd, cores=len(nd["cores"])) for _, nd in sorted(nodes.items())]


# ----------------------------------------------------------------------------- bandwidth
def memcopy_gbs(nbytes: int, repeats: int = 5) -> float:
    """Best-of bandwidth of one np.copyto of ``nbytes``, read + write counted, GB/s."""
    src = np.ones(max(1, nbytes // 4), dtype=np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * src.nbytes / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return max(time.perf_counter() - t0, 1e-9)


def bus_gbs(nbytes: int, ranks: int, seconds: float) -> float:
    """All-reduce bus bandwidth (what each link carries, as nccl-tests report it): 2(p-1)/p bytes per
    rank per all-reduce."""
    return 2 * (ranks - 1) / ranks * nbytes / max(seconds, 1e-9) / 1e9


def check_allreduce_in_node(ctx: Ctx, name: str) -> Check:
    if ctx.topo is None:
        return _no_mpi(name)
    nbytes, repeats = int(ctx.args.allreduce_mb * 1e6), 5
    copy = ctx.on_leaders(lambda: memcopy_gbs(nbytes))
    ctx.topo.comm.Barrier()
    from .comm import probe
    times, right = probe.allreduce_seconds(ctx.topo.node_comm, nbytes, repeats)   # every node at once
    per_node = ctx.on_leaders(lambda: [ctx.topo.local_size, min(times)])
    per_node = [(p, t) for p, t in per_node if p > 1]
    if not right:
        return Check(name, FAIL, "the all-reduce within a node gave a wrong sum",
                     "the MPI library's shared-memory transport is broken: try another MPI build")
    if not per_node:
        return Check(name, NA, "one rank per node: nothing to reduce within a node",
                     "start several ranks per node to measure it")
    p, t = min(per_node, key=lambda pt: bus_gbs(nbytes, pt[0], pt[1]))
    bw, mem = bus_gbs(nbytes, p, t), min(copy)
    data = {"bytes": nbytes, "ranks": p, "seconds": t, "bus_gbs": bw, "memcopy_gbs": mem}
    result = (f"{bw:.2f} GB/s bus bandwidth, {p} ranks, {nbytes / 1e6:g} MB (slowest node, best of "
              f"{repeats}); memory copy {mem:.1f} GB/s ({bw / mem:.0%})")
    if bw < INTRA_MIN_FRACTION * mem:
        return Check(name, WARN, result, "below 5% of a memory copy: check ranks per node <= cores "
                     "and that MPI uses shared memory within a node", data)
    return Check(name, OK, result, data=data)


def check_allreduce_across_nodes(ctx: Ctx, name: str) -> Check:
    if ctx.topo is None:
        return _no_mpi(name)
    if ctx.num_nodes < 2:
        return Check(name, NA, "one node: nothing crosses the network",
                     "run doctor on 2 or more nodes (e.g. srun -N 2 --ntasks-per-node=1) to measure it")
    from .comm import probe
    nbytes, repeats = int(ctx.args.allreduce_mb * 1e6), 5
    comm = probe.leaders(ctx.topo)                     # rank 0 is always in it
    if comm is None:                                   # (this rank's row is not reported)
        ctx.topo.comm.Barrier()
        return Check(name, NA, "measured by one rank per node")
    times, right = probe.allreduce_seconds(comm, nbytes, repeats)
    mem = memcopy_gbs(nbytes)
    comm.Free()
    ctx.topo.comm.Barrier()
    p = ctx.num_nodes
    bw = bus_gbs(nbytes, p, min(times))
    data = {"bytes": nbytes, "nodes": p, "seconds": min(times), "bus_gbs": bw, "memcopy_gbs": mem}
    if not right:
        return Check(name, FAIL, "the all-reduce across nodes gave a wrong sum", "the MPI library's "
                     "network transport is broken: try the MPI the cluster recommends", data)
    result = (f"{bw:.2f} GB/s bus bandwidth, one rank on each of {p} nodes, {nbytes / 1e6:g} MB "
              f"(best of {repeats}); memory copy {mem:.1f} GB/s")
    if bw < NETWORK_MIN_GBS:
        return Check(name, WARN, result, "slower than 10 Gbit/s Ethernet: make MPI use the fast network "
                     "(the cluster's MPI module, UCX_NET_DEVICES / FI_PROVIDER)", data)
    return Check(name, OK, result, data=data)


def _no_mpi(name: str) -> Check:
    return Check(name, NA, "MPI did not start (see the launcher row)", "fix the launcher row first")


# ----------------------------------------------------------------------------- one-sided progress
def busy(seconds: float) -> None:
    """Computes for ``seconds`` without entering MPI (small GEMMs), as a training step does."""
    a = np.full((64, 64), 1.0 / 64, dtype=np.float32)
    b = np.empty_like(a)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.dot(a, a, out=b)


def rma_targets(nodes: list[int]) -> dict[str, int]:
    """The ranks rank 0 reads from: the first other rank on its node and the first rank on another
    node, where they exist ({'same node': r, 'other node': r'})."""
    same = [r for r in range(1, len(nodes)) if nodes[r] == nodes[0]]
    other = [r for r in range(1, len(nodes)) if nodes[r] != nodes[0]]
    return {k: v[0] for k, v in (("same node", same), ("other node", other)) if v}


def progress_fix(library: str) -> str:
    """The setting that lets one-sided calls complete while the target computes, per MPI family."""
    if "Intel(R) MPI" in library:
        return "set I_MPI_ASYNC_PROGRESS=1 in the job's environment (gossip otherwise waits for busy peers)"
    if "Open MPI" in library:
        return ("Open MPI has no general progress thread: on TCP set OMPI_MCA_btl_tcp_progress_thread=1; "
                "on InfiniBand/RoCE make sure its UCX one-sided component serves the windows")
    return ("set MPIR_CVAR_ASYNC_PROGRESS=1 in the job's environment (MPICH: one progress thread per "
            "rank, which needs a spare core); gossip otherwise waits for busy peers")


def check_one_sided_progress(ctx: Ctx, name: str) -> Check:
    if ctx.topo is None:
        return _no_mpi(name)
    if ctx.size < 2:
        return Check(name, NA, "one rank: no other rank to read from",
                     "run under mpiexec -n 2 or more (on 2 nodes to see the network's behaviour)")
    from .comm import probe
    busy_s, targets = ctx.args.busy_seconds, rma_targets(ctx.nodes.tolist())
    lat = {where: probe.rma_latencies(ctx.topo.comm, 0, t, busy_s, busy) for where, t in targets.items()}
    waited = [f"{op} ({where})" for where, ops in lat.items() for op, s in ops.items()
              if s > RMA_WAITED * busy_s]
    parts = "; ".join(f"{where} (rank {targets[where]}): " + ", ".join(
        f"{op} {s * 1e3:.1f} ms" for op, s in ops.items()) for where, ops in lat.items())
    result = f"target computing {busy_s:g} s outside MPI; {parts}"
    data = {"busy_seconds": busy_s, "targets": targets, "seconds": lat, "waited": waited}
    if waited:
        return Check(name, WARN, f"{', '.join(waited)} waited for the busy target: {result}",
                     progress_fix(ctx.start.library), data)
    if "other node" not in lat:
        result += " (one node: across nodes not checked)"
    return Check(name, OK, result, data=data)


# ----------------------------------------------------------------------------- GPUs
NO_GPU_FIX = "needs a GPU on every rank (the cupy / cuda row says why there is none)"


def _cuda_version(v: int) -> str:
    """CUDA's integer versions (12040) as '12.4'."""
    return f"{v // 1000}.{v % 1000 // 10}"


def gpu_facts(local_rank: int) -> dict:
    """This rank's CUDA view: {'reason'} without a usable GPU, else versions, the GPU this rank pins
    (local_rank % count, as backend.select does; pinned here) and its PCI bus id.  The CuPy calls
    here have NEVER RUN ON A GPU."""
    from .backend import _try_cupy
    cupy, info = _try_cupy()
    if cupy is None:
        return {"reason": info}
    rt, dev = cupy.cuda.runtime, local_rank % info
    cupy.cuda.Device(dev).use()                  # as backend.select pins it; later checks use it
    name = rt.getDeviceProperties(dev)["name"]              # bytes in CuPy's runtime API
    return {"count": info, "device": dev, "bus": cupy.cuda.Device(dev).pci_bus_id,
            "name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
            "cupy": cupy.__version__, "driver": _cuda_version(rt.driverGetVersion()),
            "runtime": _cuda_version(rt.runtimeGetVersion())}


def _gpu_ranks(ctx: Ctx) -> bool:
    """True when every rank has a GPU (after check_cupy_cuda gathered ``ctx.gpus``)."""
    return bool(ctx.gpus) and all("count" in g for g in ctx.gpus)


def _no_gpu(name: str, extra: str = "") -> Check:
    return Check(name, NA, f"no GPU{extra}", NO_GPU_FIX)


def check_cupy_cuda(ctx: Ctx, name: str) -> Check:
    ctx.gpus = ctx.gather(gpu_facts(ctx.local_rank))
    without = [r for r, g in enumerate(ctx.gpus) if "count" not in g]
    if len(without) == ctx.size:
        return Check(name, NA, f"no GPU: {ctx.gpus[0]['reason']}", "on GPU nodes install the CuPy "
                     "extra: .venv/bin/pip install -e '.[cupy]' (a CuPy built for the node's CUDA driver)")
    if without:
        return Check(name, FAIL, f"ranks {_ranges(without)} have no usable GPU "
                     f"({ctx.gpus[without[0]]['reason']}) while the others have one",
                     "every rank of a GPU job needs a GPU: check CUDA_VISIBLE_DEVICES and the job's nodes")
    g = ctx.gpus[0]
    names = sorted({x["name"] for x in ctx.gpus})
    return Check(name, OK, f"CuPy {g['cupy']}, CUDA driver {g['driver']}, runtime {g['runtime']}; "
                 f"{g['count']} GPU{'s' * (g['count'] > 1)} per node ({', '.join(names)})",
                 data={"ranks": ctx.gpus})


def check_gpu_mapping(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; each rank would pin GPU local_rank % GPUs per node")
    nodes, problems = {}, []
    for r, (node, g) in enumerate(zip(ctx.nodes.tolist(), ctx.gpus)):
        nodes.setdefault(node, []).append((r, g["device"], g["count"]))
    for node, ranks in nodes.items():
        devices, count = {d for _, d, _ in ranks}, ranks[0][2]
        if len(devices) < len(ranks):
            problems.append(f"the node of rank {node}: {len(ranks)} ranks share {len(devices)} GPUs")
        elif len(devices) < count:
            problems.append(f"the node of rank {node}: {count - len(devices)} of {count} GPUs idle")
    first = next(iter(nodes.values()))
    shown = " ".join(f"{r}->{d}" for r, d, _ in first[:8]) + (" ..." if len(first) > 8 else "")
    data = {"mapping": [[r, g["device"], g["bus"]] for r, g in enumerate(ctx.gpus)]}
    if problems:
        return Check(name, WARN, "; ".join(problems[:3]), "start one rank per GPU "
                     "(e.g. srun --ntasks-per-node=GPUs per node, or mpiexec -ppn GPUs per node)", data)
    return Check(name, OK, f"one GPU per rank, by local rank (first node: {shown})", data=data)


def check_nccl(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name)
    from .comm import device
    nccl = device.nccl_module()
    versions = ctx.gather(_nccl_version(nccl.get_version()) if nccl else "")
    missing = [r for r, v in enumerate(versions) if not v]
    if missing:
        return Check(name, WARN, f"no NCCL bindings in CuPy on ranks {_ranges(missing)}: the allreduce "
                     "method falls back to CUDA-aware MPI or host copies", "install NCCL where CuPy "
                     "finds it: python -m cupyx.tools.install_library --library nccl --cuda 12.x")
    return Check(name, OK, f"NCCL {versions[0]} on every rank (allreduce_transport auto uses it)")


def _nccl_version(v: int) -> str:
    """NCCL's integer version (22105, or 2708 before 2.9) as '2.21.5'."""
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def check_cuda_aware_mpi(ctx: Ctx, name: str) -> Check:
    from .comm import device
    if ctx.topo is None:
        return _no_mpi(name)
    says = ctx.gather(device.mpi_cuda_query())
    claim = {True: "says yes", False: "says no", None: "is not available"}[says[0]]
    if not _gpu_ranks(ctx):
        return _no_gpu(name, f"; MPIX_Query_cuda_support of the MPI library {claim}")
    if not all(s is True for s in says):
        return Check(name, WARN, f"not CUDA-aware on every rank (MPIX_Query_cuda_support {claim} on rank 0):"
                     " device buffers reach MPI through host copies", "for fewer copies: the cluster's "
                     "CUDA-aware MPI (e.g. Open MPI with UCX built with CUDA); NCCL does not need it")
    if device.transfer_works(ctx.topo.comm):           # collective; NEVER RUN ON A GPU
        return Check(name, OK, "MPI reports CUDA support and an all-reduce of device arrays gave the "
                     "right sum")
    return Check(name, FAIL, "MPI reports CUDA support but an all-reduce of device arrays gave a wrong "
                 "sum or an error", "set dist.allreduce_transport = nccl or host until the MPI is fixed")


def check_cudnn_frontend(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; convolutions use im2col + GEMM")
    from .nn.cudnn_conv import probe_cudnn
    cudnn = probe_cudnn()
    found = ctx.gather(f"{getattr(cudnn, '__version__', '?')} (cuDNN {cudnn.backend_version()})"
                       if cudnn else "")
    missing = [r for r, v in enumerate(found) if not v]
    if missing:
        return Check(name, WARN, f"'import cudnn' fails on ranks {_ranges(missing)}: conv_impl auto "
                     "uses im2col + GEMM there (slower)", "pip install nvidia-cudnn-frontend (with a cuDNN 9 "
                     "runtime, e.g. nvidia-cudnn-cu12)")
    return Check(name, OK, f"cuDNN Frontend {found[0]} on every rank (conv_impl auto uses it)")


def check_fast_paths(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; the NumPy reference paths are the only ones")
    results = ctx.gather(kernel_checks())
    failed = [(r, k, o["error"]) for r, res in enumerate(results) for k, o in res.items()
              if o["status"] != "used"]
    data = {"ranks": results}
    if failed:
        r, k, why = failed[0]
        return Check(name, WARN, f"{k} failed its check on rank {r} ({why}); {len(failed)} failure(s) in "
                     "all: training falls back to the reference twin", "bash benchmarks/gpu_check.sh "
                     "shows every fast path (cuDNN graphs too) against its reference on this GPU", data)
    return Check(name, OK, f"{len(results[0])} fused-kernel checks match their reference twins on every "
                 "rank's GPU (cuDNN graphs are checked at the start of each training run)", data=data)


def kernel_checks() -> dict:
    """The fused CUDA kernels of nn/kernels.py against their ``_ref`` twins on this rank's GPU, as a
    training run checks them at start-up (fastpaths.py): {component: {'status', 'error'}}.  NEVER
    RUN ON A GPU."""
    from . import fastpaths
    from .backend import _try_cupy
    cupy, _ = _try_cupy()
    outcome = fastpaths.validate(fastpaths.kernel_components(cupy), "auto", speak=False)
    return {k: {"status": o["status"], "error": o.get("error", "")} for k, o in outcome.items()}


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}-{ranks[j]}" if j > i else str(ranks[i]))
        i = j + 1
    return ",".join(out)


# ----------------------------------------------------------------------------- DALI
def make_jpeg() -> tuple[np.ndarray, np.ndarray]:
    """A 64x48 colour gradient encoded by Pillow in memory: ((n,) uint8 JPEG bytes, (48, 64, 3) uint8
    Pillow's decode of them, the reference)."""
    from PIL import Image
    img = np.zeros((48, 64, 3), dtype=np.uint8)
    img[..., 0] = np.arange(64, dtype=np.uint8) * 4
    img[..., 1] = np.arange(48, dtype=np.uint8)[:, None] * 5
    img[..., 2] = 128
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    data = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        return data, np.asarray(im.convert("RGB"))


def _decode_on_node(device_id: int | None) -> dict:
    """One node's decode of the JPEG of ``make_jpeg`` with the training loader's decoder
    (``fastpaths.decode_crops``: DALI's image_slice of a centre window), on the CPU or, with
    ``device_id``, the 'mixed' GPU decoder (NEVER RUN ON A GPU), against its reference: Pillow's
    decode of the same window, or DALI's CPU decode for the GPU.  {'error': relative error,
    'problem': '' or why, 'ms', 'version'}."""
    try:
        import nvidia.dali
        from . import fastpaths
        data, ref = make_jpeg()
        h, w = ref.shape[:2]
        t0 = time.perf_counter()
        got = fastpaths.decode_crops([data], "cpu" if device_id is None else "mixed", device_id)
        ms = (time.perf_counter() - t0) * 1e3
        want = [ref[h // 4:h - h // 4, w // 8:w - w // 8]] if device_id is None else \
            fastpaths.decode_crops([data], "cpu")
        err, why = fastpaths.compare(got, want, fastpaths.DECODE_TOL, ("the window",))
    except Exception as exc:       # noqa: BLE001 - ImportError, a DALI error: the row says which
        return {"problem": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
    return {"error": err, "problem": why or "", "ms": round(ms, 2), "version": nvidia.dali.__version__}


def _decode_row(name: str, nodes: list[dict], what: str, fix: str) -> Check:
    bad = [n for n in nodes if n["problem"]]
    if bad:
        return Check(name, FAIL, f"{len(bad)} of {len(nodes)} node(s): {bad[0]['problem']}", fix,
                     {"nodes": nodes})
    return Check(name, OK, f"DALI {nodes[0]['version']}: {what} (relative error "
                 f"{max(n['error'] for n in nodes):.1e}) on every node", data={"nodes": nodes})


def check_dali_cpu_decode(ctx: Ctx, name: str) -> Check:
    nodes = ctx.on_leaders(lambda: _decode_on_node(None))
    return _decode_row(name, nodes, "the loader's CPU decoder reads a 64x48 JPEG as Pillow does",
                       "install DALI into this environment: pip install nvidia-dali-cuda120 (its CPU "
                       "decoder needs no GPU)")


def check_dali_gpu_decode(ctx: Ctx, name: str) -> Check:
    if not _gpu_ranks(ctx):
        return _no_gpu(name, "; DALI decodes on the CPU")
    nodes = ctx.on_leaders(lambda: _decode_on_node(ctx.gpus[ctx.rank]["device"]))
    return _decode_row(name, nodes, "GPU decode of a 64x48 JPEG matches the CPU decode",
                       "install the DALI wheel for the node's CUDA (nvidia-dali-cuda120 for CUDA 12); "
                       "a training run falls back to the CPU decoder by itself")


# ----------------------------------------------------------------------------- data and disk
def verify_share(root: Path, rank: int, size: int) -> dict:
    """This rank's part of the data check: both splits opened as training opens them (manifest,
    every shard's attributes and labels), then, for the shards j with j % size == rank, the sha256
    against the manifest and a strict decode of the first DECODED_PER_SHARD samples.  Returns
    {'problem': the first one or '', 'splits': {split: [samples, shards]}, 'shards', 'bytes', 'decoded'}."""
    from .data.shards import SPLITS, ShardError, ShardSet
    out = {"problem": "", "splits": {}, "shards": 0, "bytes": 0, "decoded": 0}
    try:
        sets = [ShardSet.open(root, split) for split in SPLITS]
    except ShardError as exc:
        return dict(out, problem=str(exc))
    out["splits"] = {ss.split: [ss.num_samples, len(ss.shard_paths)] for ss in sets}
    mine = [(ss, i) for ss in sets for i in range(len(ss.shard_paths))][rank::size]
    for ss, i in mine:
        problem, nbytes, decoded = _verify_shard(ss, i)
        out["shards"] += 1
        out["bytes"] += nbytes
        out["decoded"] += decoded
        if problem:
            out["problem"] = problem
            break
    for ss in sets:
        ss.close()
    return out


def _verify_shard(ss, i: int) -> tuple[str, int, int]:
    """Shard ``i`` of ``ss``: (problem or '', bytes read for the checksum, samples decoded)."""
    from .data.shards import file_sha256
    from .data.validate import decode_problem
    entries = ss.manifest["splits"][ss.split]["shards"]
    path, first = ss.shard_paths[i], sum(int(e["count"]) for e in entries[:i])
    try:
        got = file_sha256(path)
        if got != entries[i]["sha256"]:
            return f"{path}: sha256 {got[:16]}... differs from the manifest's", 0, 0
        decoded = 0
        for local in range(min(DECODED_PER_SHARD, int(entries[i]["count"]))):
            why = decode_problem(ss.read(first + local)[0])
            if why:
                return f"{path}[{local}]: {why}", path.stat().st_size, decoded
            decoded += 1
    except (OSError, KeyError, ValueError, RuntimeError) as exc:
        return f"{path}: cannot read it ({' '.join(str(exc).split())})", 0, 0
    return "", path.stat().st_size, decoded


def check_data(ctx: Ctx, name: str) -> Check:
    if not ctx.args.data:
        return Check(name, NA, "no --data given (the built-in digits are built and checked by the "
                     "program itself)", "pass --data DIR, the shard directory your jobs use")
    root = Path(ctx.args.data)
    parts = ctx.gather(verify_share(root, ctx.rank, ctx.size))
    problems = [p["problem"] for p in parts if p["problem"]]
    data = {k: sum(p[k] for p in parts) for k in ("shards", "bytes", "decoded")}
    if problems:
        return Check(name, FAIL, problems[0] + _elsewhere(problems, ctx.size), _data_fix(problems[0]),
                     dict(data, problems=problems))
    splits = ", ".join(f"{s} {n:,} samples in {k} shard{'s' * (k > 1)}"
                       for s, (n, k) in parts[0]["splits"].items())
    return Check(name, OK, f"{root}: {splits}; sha256 of all {data['shards']} shards "
                 f"({_size(data['bytes'])}) and {data['decoded']} samples decoded, read by "
                 f"{ctx.size} rank{'s' * (ctx.size > 1)} on {ctx.num_nodes} node{'s' * (ctx.num_nodes > 1)}",
                 data=dict(data, splits=parts[0]["splits"]))


def _elsewhere(problems: list[str], size: int) -> str:
    """What the other ranks found, after the first problem: '' or a short note."""
    if len(problems) == size > 1 and len(set(problems)) == 1:
        return " (on every rank)"
    return f" (and {len(problems) - 1} more problem(s) on other ranks)" if len(problems) > 1 else ""


def _data_fix(problem: str) -> str:
    if "manifest not found" in problem:
        return "--data must name the directory holding manifest.json, at the same path on every node"
    return ("rebuild the shard directory or copy it again (scalesgd-make-shards, docs/data.md); it must "
            "be at the same path on every node")


def _size(nbytes: float) -> str:
    """Bytes in the unit a reader wants: '812 kB', '1.2 MB', '148.3 GB'."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes / 1e3:,.0f} kB"


def disk_facts(run_dir: Path) -> dict:
    """{'where': the run directory or its nearest existing parent (runs create it), 'free_gb',
    'problem': '' or why runs could not write there}."""
    where = run_dir.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return {"where": str(where), "free_gb": 0.0, "problem": f"{where} is not a directory"}
    free = shutil.disk_usage(where).free / 1e9
    try:
        fd, tmp = tempfile.mkstemp(prefix=".scalesgd-doctor-", dir=where)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return {"where": str(where), "free_gb": free, "problem": f"cannot write in {where} "
                f"({exc.strerror or exc})"}
    return {"where": str(where), "free_gb": free, "problem": ""}


def check_run_dir(ctx: Ctx, name: str) -> Check:
    nodes = ctx.on_leaders(lambda: disk_facts(Path(ctx.args.run_dir)))
    least = min(nodes, key=lambda n: n["free_gb"])
    bad = next((n["problem"] for n in nodes if n["problem"]), "")
    data = {"nodes": nodes}
    if bad or least["free_gb"] < DISK_FAIL_GB:
        return Check(name, FAIL, bad or f"{least['where']}: only {least['free_gb']:.2f} GB free",
                     "pass --run-dir on a writable file system with room for checkpoints", data)
    result = (f"{ctx.args.run_dir}: writable, {least['free_gb']:,.1f} GB free"
              f"{' (least of ' + str(len(nodes)) + ' nodes)' if len(nodes) > 1 else ''}")
    if least["free_gb"] < DISK_WARN_GB:
        return Check(name, WARN, result, "checkpoints of large models need more: free some space or "
                     "pass --run-dir elsewhere", data)
    return Check(name, OK, result, data=data)


# The rows, in order (every rank runs each, in this order: some are collectives).
CHECKS = (
    ("mpi library", check_mpi_library),
    ("launcher", check_launcher),
    ("ranks per node", check_ranks_per_node),
    ("allreduce in node", check_allreduce_in_node),
    ("allreduce across nodes", check_allreduce_across_nodes),
    ("one-sided progress", check_one_sided_progress),
    ("cupy / cuda", check_cupy_cuda),
    ("rank -> gpu", check_gpu_mapping),
    ("nccl", check_nccl),
    ("cuda-aware mpi", check_cuda_aware_mpi),
    ("cudnn frontend", check_cudnn_frontend),
    ("gpu fast paths", check_fast_paths),
    ("dali cpu decode", check_dali_cpu_decode),
    ("dali gpu decode", check_dali_gpu_decode),
    ("data (--data)", check_data),
    ("run dir disk", check_run_dir),
)
