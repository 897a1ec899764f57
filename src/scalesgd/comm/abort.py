"""Fail fast and together: one rank's error ends the whole job with a message naming the cause."""
from __future__ import annotations

import sys


def fail(topo, message: str, code: int = 1) -> None:
    """Prints ``scalesgd: error: ...`` (with the rank when there are several) and ends the job.

    With one rank this is a plain exit; with several, MPI_Abort takes every rank down at once, so
    peers blocked in a collective never hang.
    """
    where = f" (rank {topo.rank}/{topo.size})" if topo is not None and topo.size > 1 else ""
    print(f"scalesgd: error{where}: {message}", file=sys.stderr, flush=True)
    if topo is not None and topo.size > 1:
        topo.comm.Abort(code)
    sys.exit(code)
