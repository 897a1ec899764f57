"""The verdict logic of the scripts under tests/mpi/ (run with mpiexec by the tests): every rank
runs each check in turn; rank 0 prints ``NAME: ok`` once a check has passed on every rank.  A rank
whose check raises prints its traceback and aborts the whole job at once: its peers may be blocked
in a collective or a point-to-point call of that check (a parameter-server exchange) where no
verdict could ever reach them, so the job must not wait for them."""
import os
import sys
import time
import traceback

from mpi4py import MPI


def run_checks(*checks) -> None:
    """Runs each ``check(comm)`` on every rank; a failure on any rank fails the job (non-zero)."""
    comm = MPI.COMM_WORLD
    for check in checks:
        t0 = time.perf_counter()
        try:
            check(comm)
        except Exception:
            print(f"[rank {comm.rank}] {check.__name__} FAILED:\n{traceback.format_exc()}",
                  file=sys.stderr, flush=True)
            time.sleep(0.5)                      # let mpiexec forward the message before the abort
            comm.Abort(1)
            os._exit(1)                          # MPICH's Abort can return before the kill arrives
        comm.Barrier()                           # every rank passed it
        if comm.rank == 0:
            print(f"{check.__name__}: ok ({time.perf_counter() - t0:.2f} s)", flush=True)
