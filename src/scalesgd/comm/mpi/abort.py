"""Fail fast and together: one rank's error ends the whole job with a message naming the cause."""
from __future__ import annotations

import os
import sys
import time

from ..shm import unlink_mapped_segments

SHARED_ERROR_GRACE_S = 10.0   # how long ranks wait for each other to agree on a shared error
DRAIN_S = 0.5                 # lets the launcher forward the message before MPI_Abort kills the job


def _all_arrived(comm, timeout: float) -> bool:
    """Non-blocking barrier with a timeout: True when every rank arrived in time."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def fail(topo, message: str, code: int = 1, shared: bool = False, release=None) -> None:
    """Prints ``scalesgd: error: ...`` and ends the job with exit status ``code``.

    - one rank: print and exit.
    - ``shared`` (every rank detects this error alike: bad config, wrong rank count): the ranks
      meet in a barrier, rank 0 alone prints, every rank exits with ``code``.  If some rank does not
      arrive within the grace period, fall through to the abort below.  ``release`` (collective:
      what the run holds of MPI, its windows and communicators) runs once every rank has arrived,
      so that MPI_Finalize finds nothing left.
    - otherwise (this rank alone): print with the rank, give the launcher a moment to forward the
      line (hydra drops a dying rank's unforwarded output), then MPI_Abort ends every rank, so no
      peer is left blocked in a collective.
    """
    from . import failures
    topo = failures.current(topo)         # after a survived death: the survivors' communicator
    several = topo is not None and topo.size > 1
    if several and shared and _all_arrived(topo.comm, SHARED_ERROR_GRACE_S):
        if topo.rank == 0:
            print(f"scalesgd: error: {message}", file=sys.stderr, flush=True)
        if release is not None:
            try:
                release()
            except Exception:  # noqa: BLE001 - the job ends anyway; MPI_Finalize then reports what is left
                pass
        failures.leave(topo, code)        # (after a survived death: no MPI_Finalize)
        sys.exit(code)
    _end(topo, message, code, "scalesgd")
    sys.exit(code)


def fail_from_thread(topo, message: str, code: int = 1, who: str = "scalesgd") -> None:
    """``fail`` for a helper thread (a watchdog, a deadline), where ``sys.exit`` would end only the
    thread: prints, aborts every rank, and ends this process whatever its main thread is doing."""
    _end(topo, message, code, who, from_thread=True)
    os._exit(code)                # MPICH's MPI_Abort may return in a thread once it told the launcher


def _end(topo, message: str, code: int, who: str, from_thread: bool = False) -> None:
    """Print with the rank, give the launcher a moment to forward the line (hydra drops a dying
    rank's unforwarded output), free this rank's /dev/shm segments, then MPI_Abort every rank."""
    several = topo is not None and topo.size > 1
    where = f" (rank {topo.rank}/{topo.size})" if several else ""
    print(f"{who}: error{where}: {message}", file=sys.stderr, flush=True)
    if several:
        time.sleep(DRAIN_S)
        unlink_mapped_segments()      # MPI_Abort skips MPI_Finalize, which would free /dev/shm
        if from_thread:               # MPI_Abort from a second thread needs MPI_THREAD_MULTIPLE; else
            from mpi4py import MPI    # noqa: PLC0415 - the launcher sees this process's exit instead
            if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                return
        topo.comm.Abort(code)
