"""Helpers for the scripts under tests/mpi/ (run with mpiexec by the tests): every rank runs its
checks, the ranks agree on the verdict (so they fail together), rank 0 prints it."""
import sys
import traceback

from mpi4py import MPI


def run_checks(*checks) -> None:
    """Runs each ``check(comm)`` on every rank; any rank's failure fails the job on every rank."""
    comm = MPI.COMM_WORLD
    for check in checks:
        ok, msg = 1, ""
        try:
            check(comm)
        except Exception:
            ok, msg = 0, traceback.format_exc()
        if not ok:
            print(f"[rank {comm.rank}] {check.__name__} FAILED:\n{msg}", file=sys.stderr, flush=True)
        all_ok = comm.allreduce(ok, op=MPI.MIN)
        if comm.rank == 0:
            print(f"{check.__name__}: {'ok' if all_ok else 'FAILED'}", flush=True)
        if not all_ok:
            comm.Barrier()
            sys.exit(1)
