"""Helpers for the scripts under tests/mpi/ (run with mpiexec by the tests): every rank runs its
checks, the ranks agree on the verdict (so they fail together), rank 0 prints it.  A check that
raises on one rank while the others wait in a collective aborts the job at once (no hang)."""
import sys
import time
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
            time.sleep(0.5)                      # let mpiexec forward the message
            comm.Abort(1)                        # peers may be blocked in one of the check's collectives
        all_ok = comm.allreduce(ok, op=MPI.MIN)
        if comm.rank == 0:
            print(f"{check.__name__}: {'ok' if all_ok else 'FAILED'}", flush=True)
        if not all_ok:
            comm.Barrier()
            sys.exit(1)
