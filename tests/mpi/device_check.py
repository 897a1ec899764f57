"""The all-reduce transports' choice and host staging across ranks, run as
``mpiexec -n 2 python tests/mpi/device_check.py`` (no GPU: probes are injected per rank, and a
device buffer is stood in for by ``StandIn``, which has CuPy's ``get(out=)``/``set()``)."""
import types

import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd.comm import device
from scalesgd.comm.collectives import BucketedAllreduce
from scalesgd.comm.device import Probes
from scalesgd.errors import MethodError
from scalesgd.nn.params import Layout, TensorSpec


class StandIn:
    """A non-NumPy flat buffer with the part of cupy.ndarray the host transport uses: slicing,
    ``get(out=)`` (device -> host) and ``set(host)`` (host -> device).  ``copies_down`` counts the
    elements copied down, so a test sees each bucket go down once."""

    def __init__(self, a, counter=None):
        self.a, self.counter = a, counter if counter is not None else [0]

    size = property(lambda self: self.a.size)
    dtype = property(lambda self: self.a.dtype)
    shape = property(lambda self: self.a.shape)

    def __getitem__(self, key):
        return StandIn(self.a[key], self.counter)

    def get(self, out):
        out[...] = self.a
        self.counter[0] += self.a.size
        return out

    def set(self, host):
        self.a[...] = host


def layout():
    return Layout([TensorSpec(f"t{i}", (500 + 37 * i,)) for i in range(8)])


def dist(**kw):
    return types.SimpleNamespace(**{"allreduce_transport": "auto", "bucket_mb": 0.004,
                                    "overlap": True, **kw})


def choice_is_the_same_on_every_rank(comm):
    """Ranks with different probes take one transport: rank 1 lacks NCCL, so auto is not nccl;
    rank 1's MPI is not CUDA-aware, so auto is host without a test transfer on any rank."""
    r = comm.rank
    tried = []
    got = device.resolve(comm, "auto", True, Probes(nccl=r == 0, mpi_cuda_query=r == 0 or None),
                         lambda: tried.append(1) or True)
    assert got[0] == "host" and not tried, got
    got = device.resolve(comm, "auto", True, Probes(nccl=r == 0, mpi_cuda_query=True), lambda: True)
    assert got[0] == "cuda_aware_mpi", got
    got = device.resolve(comm, "auto", True, Probes(False, True), lambda: r == 0)   # fails on rank 1
    assert got[0] == "host" and "falling back" in got[1], got
    got = device.resolve(comm, "auto", r == 0, Probes(True, True), lambda: True)   # NumPy on rank 1
    assert got[0] == "host", got


def named_transport_some_rank_cannot_use_fails_everywhere(comm):
    """By name, no fallback: the same MethodError on every rank (so none waits for the others)."""
    r = comm.rank
    cases = [("nccl", True, Probes(nccl=r == 0, mpi_cuda_query=True), lambda: True, "NCCL"),
             ("cuda_aware_mpi", True, Probes(False, True), lambda: r == 0, "test all-reduce"),
             ("nccl", r == 0, Probes(True, True), lambda: True, "NumPy")]
    for name, on_device, probes, ok, words in cases:
        try:
            device.resolve(comm, name, on_device, probes, ok)
        except MethodError as exc:
            msg = str(exc)
        else:
            raise AssertionError(f"{name}: no error")
        assert msg.startswith(f"dist.allreduce_transport = {name}:") and words in msg, msg
        assert comm.allgather(msg) == [msg] * comm.size


def numpy_buffers_use_host_directly(comm):
    """NumPy gradients: the factory's reducer is the host one on the array itself (no copy), and
    its sums equal a blocking MPI all-reduce of each bucket, bit for bit, overlap on and off."""
    lay = layout()
    for overlap in (True, False):
        for bucket_bytes_mb in (0.0, 0.004, 1.0):
            rng = np.random.default_rng([comm.rank, 3])
            flat = rng.standard_normal(lay.size).astype(np.float32)
            want = flat.copy()
            red = device.create_allreducer(comm, flat, lay, dist(bucket_mb=bucket_bytes_mb,
                                                                 overlap=overlap))
            assert type(red) is BucketedAllreduce and red.buf is flat and red.overlap is overlap
            for lo, hi, _ in red.buckets:
                comm.Allreduce(MPI.IN_PLACE, want[lo:hi], op=MPI.SUM)
            for spec in reversed(lay.specs):
                red.ready([spec.name])
            assert len(red.requests) == (len(red.buckets) if overlap else 0)
            red.finish()
            assert np.array_equal(flat, want), (overlap, bucket_bytes_mb)


def device_buffers_staged_per_bucket_with_overlap(comm):
    """A device buffer on the host transport: each bucket is copied down once as it starts (during
    backward: overlap is honoured, not silently dropped), the sum copied up in finish()."""
    lay = layout()
    for overlap in (True, False):
        counter = [0]
        flat = StandIn(np.full(lay.size, float(comm.rank + 1)), counter)
        red = device.make_allreducer("host", comm, flat, lay, 4000, overlap)
        assert red.buf is not flat.a and red.overlap is overlap
        for spec in reversed(lay.specs):
            red.ready([spec.name])
        started = len(red.requests)
        assert started == (len(red.buckets) if overlap else 0) and counter[0] == (lay.size if overlap else 0)
        assert np.all(flat.a == comm.rank + 1), "flat is written only in finish()"
        red.finish()
        assert counter[0] == lay.size, "every element copied down exactly once"
        assert np.all(flat.a == comm.size * (comm.size + 1) / 2), overlap


class FakeNccl:
    """Stands in for cupy.cuda.nccl (not runnable here): records the communicator's unique id and
    counts communicators created against destroyed (``live``)."""

    NCCL_FLOAT32, NCCL_FLOAT64, NCCL_SUM = 7, 8, 0
    live = 0

    @staticmethod
    def get_unique_id():
        return tuple(range(-64, 64))             # signed chars, as CuPy returns them

    class NcclCommunicator:
        def __init__(self, size, uid, rank):
            self.args = (size, uid, rank)
            FakeNccl.live += 1

        def destroy(self):
            FakeNccl.live -= 1


class FailingIdNccl(FakeNccl):
    @staticmethod
    def get_unique_id():
        raise RuntimeError("ncclGetUniqueId failed: unhandled system error")


def nccl_lifecycle_every_communicator_is_destroyed(comm):
    """Issue 25, finding 7: the start-up check's own reducer and the one the fallback replaces
    were never destroyed; now every NCCL communicator made is destroyed once."""
    from scalesgd.methods.allreduce import AllReduce
    FakeNccl.live = 0
    flat = StandIn(np.zeros(layout().size, np.float32))
    red = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=FakeNccl)
    assert FakeNccl.live == 1
    method = AllReduce(types.SimpleNamespace(dist=dist(servers=1)), types.SimpleNamespace(size=comm.size),
                       comm, None)
    method.reducer = red
    method.use_host_transport()                   # the start-up check failed it
    assert FakeNccl.live == 0 and type(method.reducer).transport == "host"
    method.close()
    red.close()                                   # a second close is a no-op
    assert FakeNccl.live == 0


def nccl_id_failure_on_rank0_ends_every_rank(comm):
    """Issue 25, finding 7: when rank 0 cannot make the NCCL id, the others used to wait in Bcast
    for an id that never came while rank 0 went on; now every rank raises the same error."""
    from scalesgd.errors import BackendError
    flat = StandIn(np.zeros(layout().size, np.float32))
    try:
        device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=FailingIdNccl)
    except BackendError as exc:
        assert "rank 0 could not create the communicator id" in str(exc) and "unhandled system" in str(exc)
    else:
        raise AssertionError("no error")
    comm.Barrier()                                # every rank got here: nobody waits in a Bcast


def nccl_is_not_chosen_when_ranks_share_a_gpu(comm):
    """Issue 25, finding 7: more ranks than GPUs put two ranks on one device, which NCCL refuses at
    attach; auto now takes another transport, and nccl by name is an error on every rank."""
    same = Probes(True, None, 0)                 # every rank of this node on device 0
    name, why = device.resolve(comm, "auto", True, same, lambda: False)
    assert name == "host", (name, why)
    try:
        device.resolve(comm, "nccl", True, same, lambda: False)
    except MethodError as exc:
        assert "same GPU" in str(exc)
    else:
        raise AssertionError("no error")
    own = Probes(True, None, comm.rank)          # one device per rank
    assert device.resolve(comm, "auto", True, own, lambda: False)[0] == "nccl"


def nccl_reducer_gets_rank0_id_and_does_not_overlap(comm):
    flat = StandIn(np.zeros(layout().size, np.float32))
    red = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=FakeNccl)
    assert red.nccl_comm.args == (comm.size, tuple(range(-64, 64)), comm.rank)
    assert red.overlap is False and red.transport == "nccl"
    red.ready([s.name for s in layout().specs])
    assert red.requests == [], "nccl: nothing started during backward"


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(choice_is_the_same_on_every_rank, named_transport_some_rank_cannot_use_fails_everywhere,
               numpy_buffers_use_host_directly, device_buffers_staged_per_bucket_with_overlap,
               nccl_reducer_gets_rank0_id_and_does_not_overlap, nccl_lifecycle_every_communicator_is_destroyed,
               nccl_id_failure_on_rank0_ends_every_rank, nccl_is_not_chosen_when_ranks_share_a_gpu)
