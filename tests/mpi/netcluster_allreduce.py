"""Rank side of tests/test_netcluster.py: ``python netcluster_allreduce.py BYTES REPEATS``.

One warm-up ``MPI.Allreduce`` of BYTES (float32 SUM), then REPEATS timed ones, each between barriers.
Rank 0 prints one JSON line: the hostnames and CPUs of all ranks, the bytes, and the bus bandwidth of each
timed call in bytes/s, ``BYTES / t * 2 (p - 1) / p`` (what each rank sends and receives per second
in a ring all-reduce; for p = 2, simply BYTES / t)."""
import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI


def main(nbytes: int, repeats: int) -> None:
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    x = np.ones(nbytes // 4, np.float32)
    y = np.empty_like(x)
    comm.Allreduce(x, y)                                   # warm-up: connections, first touch
    busbw = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        comm.Allreduce(x, y)
        busbw.append(x.nbytes / (time.perf_counter() - t) * 2 * (p - 1) / p)
    assert float(y[0]) == p and float(y[-1]) == p, y[:4]
    hosts = comm.gather(socket.gethostname(), root=0)
    cpus = comm.gather(sorted(os.sched_getaffinity(0)), root=0)
    if comm.Get_rank() == 0:
        print(json.dumps({"hosts": hosts, "cpus": cpus, "bytes": x.nbytes, "busbw": busbw}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
