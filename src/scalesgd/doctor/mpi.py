"""The MPI rows: the library and the launch, ranks per node, all-reduce bandwidth, one-sided progress."""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from .base import FAIL, INTRA_MIN_FRACTION, NA, NETWORK_MIN_GBS, OK, RMA_WAITED, WARN, Check, Ctx


# ----------------------------------------------------------------------------- MPI and the launch
def check_mpi_library(ctx: Ctx, name: str) -> Check:
    from ..comm.mpi import library
    lib = ctx.start.library
    if not lib:
        return Check(name, FAIL, ctx.start.problem, "install an MPI where mpi4py finds it: "
                     "pip install mpich (or load the cluster's MPI module and reinstall mpi4py)")
    lib_name = library.library_name(lib)
    device = next((ln.split(":", 1)[1].strip() for ln in lib.splitlines()
                   if ln.startswith("MPICH Device")), "")                 # MPICH's netmods
    names = sorted(set(ctx.gather(lib_name)))
    if len(names) > 1:
        return Check(name, FAIL, f"the ranks load different MPI libraries: {', '.join(names)}",
                     "use the same environment (venv, MPI module) on every node")
    from ..comm.mpi import probe
    level = f"thread level {library.thread_level()}" if ctx.topo else "MPI not started"
    return Check(name, OK, f"{lib_name}{f' ({device})' if device else ''} through mpi4py "
                 f"{probe.mpi4py_version()}, {level}",
                 data={"library": lib.strip().splitlines()[0], "thread_level": level})


def check_launcher(ctx: Ctx, name: str) -> Check:
    from ..comm.mpi import library
    promise = next(((var, os.environ[var], who) for var, _, who, _ in library.LAUNCHER_VARS
                    if os.environ.get(var)), None)
    data = {"mpi_size": ctx.size, "launcher_size": library.launched_size(),
            "launcher_var": promise[0] if promise else None}
    if ctx.start.problem:
        result, _, fix = ctx.start.problem.partition("; ")
        return Check(name, FAIL, result, fix or "the launcher and the library mpi4py loads must be "
                     "the same MPI (the result says how)", data)
    said = f"as {promise[0]}={promise[1]} ({promise[2]}) promised" if promise else \
        "no launcher variables (started without a launcher)"
    return Check(name, OK, f"{ctx.size} rank{'s' * (ctx.size > 1)} in MPI_COMM_WORLD on "
                 f"{ctx.num_nodes} node{'s' * (ctx.num_nodes > 1)}, {said}", data=data)


def check_failure_survival(ctx: Ctx, name: str) -> Check:
    """Whether ``--on-failure continue`` (survive a lost rank) can run in this job: ULFM."""
    if not ctx.start.library:
        return _no_mpi(name)
    from ..comm.mpi import failures
    why = failures.unsupported() if ctx.topo else "MPI not started"
    if why:
        return Check(name, NA, f"--on-failure continue is refused here: {why}",
                     "only needed to survive a lost rank; abort (the default) and --resume work "
                     "everywhere", data={"ulfm": False})
    return Check(name, OK, "ULFM is on: --on-failure continue survives a lost rank",
                 data={"ulfm": True})


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
    from ..comm.mpi import probe
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
    from ..comm.mpi import probe
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
    from ..comm.mpi import probe
    busy_s, targets = ctx.args.busy_seconds, rma_targets(ctx.nodes.tolist())
    lat = {where: probe.rma_latencies(ctx.topo.comm, 0, t, busy_s) for where, t in targets.items()}
    waited = [f"{op} ({where})" for where, ops in lat.items() for op, s in ops.items()
              if s > RMA_WAITED * busy_s]
    parts = "; ".join(f"{where} (rank {targets[where]}): " + ", ".join(
        f"{op} {s * 1e3:.1f} ms" for op, s in ops.items()) for where, ops in lat.items())
    result = f"target computing {busy_s:g} s outside MPI; {parts}"
    data = {"busy_seconds": busy_s, "targets": targets, "seconds": lat, "waited": waited}
    if waited:
        return Check(name, WARN, f"{', '.join(waited)} waited for the busy target: {result}",
                     "scalesgd training keeps MPI progressing itself (--mpi-progress auto: see the "
                     "'progress mechanism' row); for other programs: " + progress_fix(ctx.start.library),
                     data)
    if "other node" not in lat:
        result += " (one node: across nodes not checked)"
    return Check(name, OK, result, data=data)


def check_progress_mechanism(ctx: Ctx, name: str) -> Check:
    """What keeps a gossip rank's MPI progressing here (``comm/progress.plan`` with the defaults)
    and, across nodes, the one-sided probe again with it running: ok when nothing waited."""
    if ctx.topo is None:
        return _no_mpi(name)
    from ..comm import progress
    from ..comm.mpi import library, probe
    from ..comm.jobs import IDLE_POLL_SECONDS
    from ..config import DistConfig
    d = DistConfig()
    plan = progress.plan(d.mpi_progress, d.mpi_progress_ms, IDLE_POLL_SECONDS, one_sided=True,
                         spans_nodes=ctx.num_nodes > 1, overlap=False, thread_level=library.thread_level())
    data = {"mechanism": plan.mechanism, "interval_s": plan.interval, "why": plan.why}
    result = f"blocking gossip would use {plan.describe()}; overlapped gossip its courier"
    if plan.warning:
        return Check(name, WARN, plan.warning, "start MPI with MPI_THREAD_MULTIPLE (mpi4py's default; "
                     "see MPI4PY_RC_THREAD_LEVEL), or --mpi-progress mpi", data)
    target = rma_targets(ctx.nodes.tolist()).get("other node")
    if plan.mechanism != "thread" or target is None:
        return Check(name, OK, result, data=data)
    pump = ctx.topo.transport.keep_progressing(plan)
    try:
        lat = probe.rma_latencies(ctx.topo.comm, 0, target, ctx.args.busy_seconds)
    finally:
        pump.close()
    data["seconds"] = lat
    timed = ", ".join(f"{op} {s * 1e3:.1f} ms" for op, s in lat.items())
    result += f"; with it, rank 0 -> rank {target} (other node, computing): {timed}"
    waited = [op for op, s in lat.items() if s > RMA_WAITED * ctx.args.busy_seconds]
    if waited:
        fix = ("Open MPI's one-sided component over TCP (osc/rdma) is slow at these calls even with "
               "progress (docs/cluster.md): across nodes prefer --gossip-overlap or allreduce; on "
               "InfiniBand/RoCE use its UCX one-sided component" if "Open MPI" in ctx.start.library
               else progress_fix(ctx.start.library))
        return Check(name, WARN, f"{', '.join(waited)} still waited for the busy target: " + result,
                     fix, data)
    return Check(name, OK, result, data=data)
