"""One rank's NCCL communicator through comm/mpi/device.py's ``NcclAllreduce`` (the allreduce method's
NCCL transport), the whole life of one: created from a unique id (``bytes`` on CuPy 14), one
all-reduce of a small float32 buffer (on one rank the sum is the buffer itself: checked), destroyed.

    python tests/gpu/nccl_one_rank.py cupy|double

cupy: the machine's CuPy and NCCL (gpu_check's ``nccl`` case; a one-GPU machine cannot run the
2-rank NCCL test, since NCCL refuses two ranks on one GPU); double: tests/device_double.py installed
as CuPy, with its CuPy 14 NCCL (bytes id, a tuple refused).  One line per step:
``nccl create: ok ...`` / ``nccl allreduce: sums agree ...`` / ``nccl destroy: ok``, a step that
raised as ``nccl STEP: FAILED Type: message`` (exit 1), or ``nccl skipped: why`` (exit 0)."""
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalesgd.comm.mpi import device  # noqa: E402
from scalesgd.nn.params import Layout, TensorSpec  # noqa: E402

N = 1000


def main(backend: str) -> int:
    if backend == "double":
        import device_double as dd
        xp, nccl = dd.install(), dd.Nccl
    else:
        import cupy as xp
        nccl = device.nccl_module()
        if nccl is None:
            print("nccl skipped: CuPy has no NCCL bindings here (cupy.cuda.nccl does not import)", flush=True)
            return 0
    base = np.arange(N, dtype=np.float32) * 0.5 - 7.0
    flat = xp.asarray(base)
    if backend == "double":
        dd.Nccl.arrays = {flat.data.ptr: flat.data}        # the double finds memory by address
    lay = Layout([TensorSpec("g", (N,))])
    step, red = "create", None
    try:
        t0 = time.perf_counter()
        red = device.NcclAllreduce(MPI.COMM_SELF, flat, lay, 0, overlap=False, nccl=nccl)
        v = nccl.get_version()
        print(f"nccl create: ok in {1000 * (time.perf_counter() - t0):.1f} ms (NCCL {v // 10000}."
              f"{v % 10000 // 100}.{v % 100})", flush=True)
        step = "allreduce"
        red.finish()
        xp.cuda.get_current_stream().synchronize()
        ok = np.array_equal(flat.get(), base)
        print(f"nccl allreduce: sums {'agree' if ok else 'wrong'} ({N} floats, "
              f"{1000 * red.device_seconds(wait=True):.3f} ms on the device)", flush=True)
        step = "destroy"
        red.close()
        assert red.nccl_comm is None
        print("nccl destroy: ok", flush=True)
        return 0 if ok else 1
    except Exception as exc:  # noqa: BLE001 - the step that failed, named
        print(f"nccl {step}: FAILED {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "double"))
