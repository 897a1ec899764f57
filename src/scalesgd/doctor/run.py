"""The doctor's command line, its deadline, the order of the rows and the report."""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from .base import FAIL, NA, OK, WARN, Check, Ctx
from .data import check_dali_cpu_decode, check_dali_gpu_decode, check_data, check_run_dir
from .gpu import (
    check_cuda_aware_mpi,
    check_cuda_stack,
    check_cudnn_frontend,
    check_cupy_cuda,
    check_fast_paths,
    check_gpu_mapping,
    check_nccl,
)
from .mpi import (
    check_allreduce_across_nodes,
    check_allreduce_in_node,
    check_failure_survival,
    check_launcher,
    check_mpi_library,
    check_one_sided_progress,
    check_progress_mechanism,
    check_ranks_per_node,
)


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
    from ..comm.mpi.library import LAUNCHER_VARS
    for _, rank_var, _, _ in LAUNCHER_VARS:
        if os.environ.get(rank_var, "").isdigit():
            return int(os.environ[rank_var])
    return 0




def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    from ..comm.mpi import probe
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
        from ..comm.mpi.abort import fail_from_thread
        fail_from_thread(self.topo, f"'{self.step}' did not finish within {self.seconds:g} s (a rank or "
                         "the network stopped answering); ending the job", 1, "scalesgd doctor")

    def cancel(self) -> None:
        self.timer.cancel()


def _report(ctx: Ctx, checks: list[Check], seconds: float) -> bool:
    """Rank 0: the table on stdout and the JSON file; False when the file could not be written."""
    from .._version import version
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
    from ..io.files import write_json_atomic
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




# The rows, in order (every rank runs each, in this order: some are collectives).
CHECKS = (
    ("mpi library", check_mpi_library),
    ("launcher", check_launcher),
    ("failure survival", check_failure_survival),
    ("ranks per node", check_ranks_per_node),
    ("allreduce in node", check_allreduce_in_node),
    ("allreduce across nodes", check_allreduce_across_nodes),
    ("one-sided progress", check_one_sided_progress),
    ("progress mechanism", check_progress_mechanism),
    ("cupy / cuda", check_cupy_cuda),
    ("cuda stack", check_cuda_stack),
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
