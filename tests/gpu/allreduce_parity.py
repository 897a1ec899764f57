"""Every all-reduce transport this machine can run, on 2+ ranks, against the closed-form sum:
``mpiexec -n 2 python tests/gpu/allreduce_parity.py numpy|double|cupy``.  numpy: the host transport
on NumPy buffers (the only one there is); double: the host transport's device path (side-stream
copies, events) on tests/device_double.py's arrays, whose values are still being written by queued
work when the transport starts; cupy: host staging, CUDA-aware MPI and NCCL on CuPy buffers, each
one that ``comm/mpi/device.py`` can use here (the others are named as skipped).  ``cuda_aware_mpi`` is
probed only when every rank's MPI reports CUDA support (``MPIX_Query_cuda_support``): a device
pointer handed to an MPI built without CUDA (the mpich wheel's says "CUDA not enabled") is a
SIGSEGV, which would end the check instead of naming the transport skipped."""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mpi"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import run_checks  # noqa: E402

from scalesgd.comm.mpi import device  # noqa: E402
from scalesgd.errors import MethodError  # noqa: E402
from scalesgd.fastpaths import written_late  # noqa: E402
from scalesgd.nn.params import Layout, TensorSpec  # noqa: E402

BACKEND = sys.argv[1] if len(sys.argv) > 1 else "numpy"
TIME = "--time" in sys.argv          # also time one all-reduce of a ResNet-50-sized gradient
RESNET50_PARAMS = 25_557_032
NOT_CUDA_AWARE = ("the MPI library does not report CUDA support on every rank (MPIX_Query_cuda_support "
                  "is 0 or absent), so no device buffer is handed to it (that would be a SIGSEGV)")


def transports_sum_to_the_closed_form(comm):
    """Rank r holds v_r = base + r (per element); the sum is p*base + p(p-1)/2, in 4 buckets, with
    and without overlap (buckets started as backward would report them)."""
    if BACKEND == "cupy":
        import cupy as xp
    elif BACKEND == "double":
        import device_double
        xp = device_double.install()
    else:
        xp = np
    lay = Layout([TensorSpec(f"t{i}", (2500 + 37 * i,)) for i in range(6)])
    base = np.random.default_rng(0).standard_normal(lay.size).astype(np.float32)
    p = comm.Get_size()
    want = base.astype(np.float64) * p + p * (p - 1) / 2
    names = ("host",) if BACKEND != "cupy" else ("host", "cuda_aware_mpi", "nccl")
    for name in names:
        if name == "cuda_aware_mpi" and not device.every_rank(comm, device.mpi_cuda_query() is True):
            if comm.rank == 0:
                print(f"skipped transport {name}: {NOT_CUDA_AWARE}", flush=True)
            continue
        try:
            device.resolve(comm, name, BACKEND != "numpy")
        except MethodError as exc:              # every rank alike: this machine cannot run it
            if comm.rank == 0:
                print(f"skipped transport {name}: {exc}", flush=True)
            continue
        for overlap in (True, False):
            flat = xp.asarray(base + comm.rank) if BACKEND != "double" else written_late(xp, base + comm.rank)
            red = device.make_allreducer(name, comm, flat, lay, lay.size, overlap)  # 4 buckets
            for spec in reversed(lay.specs):
                red.ready([spec.name])
            red.finish()
            got = flat if isinstance(flat, np.ndarray) else flat.get()
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err < 1e-6, (name, overlap, err)
        if comm.rank == 0:
            print(f"transport {name}: sums agree", flush=True)
        if TIME:
            time_transport(comm, xp, name)


def time_transport(comm, xp, name: str, repeats: int = 5) -> None:
    """Prints ``time NAME: MS ms per MB MB``: the median of ``repeats`` blocking all-reduces (the
    device synchronized before the clock stops) of a ResNet-50 gradient (NumPy: a tenth of it)."""
    import time
    n = RESNET50_PARAMS // (10 if BACKEND == "numpy" else 1)
    lay = Layout([TensorSpec("g", (n,))])
    flat = xp.zeros(n, dtype=np.float32)
    red = device.make_allreducer(name, comm, flat, lay, 0, False)
    sync = (lambda: None) if xp is np else xp.cuda.get_current_stream().synchronize
    times = []
    for _ in range(repeats + 1):                 # the first one warms up
        comm.Barrier()
        t0 = time.perf_counter()
        red.finish()
        sync()
        times.append(time.perf_counter() - t0)
    red.close()
    if comm.rank == 0:
        print(f"time {name}: {1000 * float(np.median(times[1:])):.3f} ms per {n * 4 / 1e6:.1f} MB",
              flush=True)


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(transports_sum_to_the_closed_form)
