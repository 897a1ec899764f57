"""Rank script (2 ranks) for tests/test_mpi_progress.py: rank 0 times Get / Accumulate / Fetch_and_op
on rank 1 while rank 1 computes outside MPI (``probe.rma_latencies``), once with nothing keeping
rank 1's MPI progressing and once with the progress thread of ``comm/progress.py``.  Prints one
JSON line from rank 0: the library, the seconds of each op per mode, the thread's pokes."""
import json
import sys

from mpi4py import MPI

from scalesgd.comm import progress
from scalesgd.comm.mpi import library, probe, start

BUSY = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0

topo = start.init()
out = {"library": MPI.Get_library_version().splitlines()[0],
       "spans_nodes": topo.transport.spans_nodes, "thread_level": library.thread_level()}
for mode in ("none", "thread"):
    pump = topo.transport.keep_progressing(progress.Plan(mode, 0.005, "the test"))
    try:
        out[mode] = probe.rma_latencies(topo.comm, 0, 1, BUSY)
    finally:
        pump.close()
    out[f"{mode}_pokes"] = pump.pokes
if topo.rank == 0:
    print(json.dumps(out), flush=True)
