"""The all-reduce transports' choice, host staging and device timing across ranks, run as
``mpiexec -n 2 python tests/mpi/device_check.py`` (no GPU: probes are injected per rank, and device
arrays, streams and events are tests/device_double.py's, installed as ``cupy``)."""
import time
import types

import device_double as dd
import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd.comm.mpi import device
from scalesgd.comm.mpi.buckets import BucketedAllreduce
from scalesgd.comm.mpi.device import Probes
from scalesgd.comm.mpi.transport import MPITransport
from scalesgd.errors import MethodError
from scalesgd.nn.params import Layout, TensorSpec
from scalesgd.train.control import Signals


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
    """A device buffer on the host transport (issue 25, finding 10): with overlap each bucket is
    copied down on a side stream as it becomes final and its sum starts once the copy has landed,
    with no host wait during backward (a wait per bucket stalled the kernel launches); only
    ``finish()`` waits.  A device that lags (copies not landed by the next ``ready``) delays the
    starts to ``finish()``, in bucket order on every rank.  The sum lands in the device buffer."""
    lay = layout()
    for overlap, keeps_up in ((True, True), (True, False), (False, True)):
        dd.reset()
        dd.STATE.gpu_keeps_up = keeps_up
        flat = dd.ndarray(np.full(lay.size, float(comm.rank + 1)))
        red = device.make_allreducer("host", comm, flat, lay, 4000, overlap)
        assert red.buf is not flat.data and red.overlap is overlap and len(red.buckets) > 2
        for spec in reversed(lay.specs):
            red.ready([spec.name])
        assert dd.STATE.waits == 0, f"{dd.STATE.waits} host waits during backward"
        started = len(red.requests)
        want = (len(red.buckets) if keeps_up else 0) if overlap else 0
        assert started == want, (overlap, keeps_up, started)
        assert np.all(flat.data == comm.rank + 1), "flat is written only in finish()"
        red.finish()
        assert dd.STATE.waits >= 1 and len(red.requests) == 0
        assert np.all(flat.data == comm.size * (comm.size + 1) / 2), (overlap, keeps_up)


class OrderCheckingTransport(MPITransport):
    """The MPI transport, asserting at the gradient sum's barrier that every bucket's ``Iallreduce`` has
    been started (MPI: every rank starts its collectives on a communicator in the same order)."""

    def __init__(self, comm):
        super().__init__(comm)
        self.method = None

    def _check(self):
        red = self.method.engine
        assert len(red.requests) == len(red.buckets), \
            f"{len(red.requests)} of {len(red.buckets)} buckets started before the barrier"

    def barrier(self):
        self._check()
        super().barrier()

    def allreduce_max_host(self, a):
        self._check()
        return super().allreduce_max_host(a)


def buckets_start_before_the_barrier_however_far_each_device_got(comm):
    """Review of issue 25's fix: a bucket's ``Iallreduce`` starts when its copy has landed, so on
    a rank whose device lags, some start only after backward.  They must all be started before the
    method's barrier on every rank (else the ranks call collectives in different orders), and
    ``progress`` (the loop calls it while it waits for the device) starts the ones that landed."""
    from scalesgd.methods.gradients import SummedGradients
    lay = layout()
    dd.reset()
    dd.STATE.gpu_keeps_up = comm.rank == 0        # rank 1's device lags behind its host
    flat = dd.ndarray(np.full(lay.size, float(comm.rank + 1)))
    transport = OrderCheckingTransport(comm)
    method = SummedGradients(transport, dist(servers=1), {"comm": 0.0, "wait": 0.0}, Signals())
    transport.method = method
    method.engine = device.make_allreducer("host", comm, flat, lay, 4000, True)
    for spec in reversed(lay.specs):
        method.engine.ready([spec.name])
    started = len(method.engine.requests)
    assert started == (len(method.engine.buckets) if comm.rank == 0 else 0), started
    if comm.rank == 1:
        dd.STATE.gpu_keeps_up = True              # the device catches up while the host waits
        method.progress()
        assert len(method.engine.requests) == len(method.engine.buckets)
    assert method.after_backward(0, None) is False          # no rank's loss diverged
    assert np.all(flat.data == comm.size * (comm.size + 1) / 2)
    for keeps_up in (True, False):                # and without progress: after_backward starts them
        dd.reset()
        dd.STATE.gpu_keeps_up = keeps_up
        flat.data[...] = comm.rank + 1
        for spec in reversed(lay.specs):
            method.engine.ready([spec.name])
        # one rank's loss is NaN: every rank learns it
        diverged = method.after_backward(1, None, loss_finite=comm.rank == 0)
        assert diverged and np.all(flat.data == comm.size * (comm.size + 1) / 2)


class FakeNccl(dd.Nccl):
    """Stands in for cupy.cuda.nccl of CuPy 14 (not runnable here: tests/device_double.py's
    ``Nccl``, whose id is ``bytes`` and whose communicator refuses any other id with TypeError):
    records the communicator's unique id and counts communicators created against destroyed."""

    live = 0

    class NcclCommunicator(dd.Nccl.NcclCommunicator):
        def __init__(self, size, uid, rank):
            super().__init__(size, uid, rank)
            FakeNccl.live += 1

        def destroy(self):
            FakeNccl.live -= 1


class Cupy13Nccl(FakeNccl):
    """CuPy 13's NCCL: the id a tuple of 128 signed chars, and only a tuple accepted."""

    @staticmethod
    def get_unique_id():
        return tuple(int(v) for v in np.frombuffer(dd.Nccl.get_unique_id(), np.int8))

    class NcclCommunicator:
        def __init__(self, size, uid, rank):
            if not isinstance(uid, tuple):
                raise TypeError("Argument 'commId' has incorrect type (expected tuple, got "
                                f"{type(uid).__name__})")
            self.args = (size, uid, rank)

        def destroy(self):
            pass


class SlowNccl(FakeNccl):
    """A NCCL whose all-reduce, like the real one, is only queued on the stream: it sums the
    registered device array over MPI and takes ``SECONDS`` when the device runs it."""

    SECONDS = 0.05
    arrays: dict = {}
    summed = 0                                   # the sums the device has run so far

    class NcclCommunicator(FakeNccl.NcclCommunicator):
        def allReduce(self, send, recv, count, dtype, op, stream):
            a = SlowNccl.arrays[recv]

            def run():
                time.sleep(SlowNccl.SECONDS)
                MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
                SlowNccl.summed += 1
            dd.enqueue(run)


def nccl_time_is_measured_on_the_device(comm):
    """Issue 25, finding 10: NCCL's ``finish()`` only enqueues the sum, so ``comm`` read ~0 and the
    sum's time landed in the next step's compute.  Now CUDA events around it measure it, and
    ``settle`` adds it to ``comm`` once the stream has run (never waiting for it itself)."""
    from scalesgd.methods.gradients import SummedGradients
    dd.reset()
    dd.STATE.gpu_keeps_up = False                 # the device runs only when the host waits for it
    flat = dd.ndarray(np.full(layout().size, float(comm.rank + 1), np.float32))
    SlowNccl.arrays, SlowNccl.summed = {flat.data.ptr: flat.data}, 0
    method = SummedGradients(MPITransport(comm), dist(servers=1), {"comm": 0.0, "wait": 0.0},
                             Signals())     # (after_backward's barrier carries them)
    method.engine = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=SlowNccl)
    for step in range(3):
        before = method.timers["comm"]            # (every earlier sum, measured on the device)
        method.after_backward(step, None)
        assert SlowNccl.summed == step, "finish() waited for the sum"   # (queued, not run)
        method.settle()                           # before the stream ran: this sum is not counted yet
        assert method.timers["comm"] - before < SlowNccl.SECONDS, (before, method.timers)
        dd.cuda.get_current_stream().synchronize()  # the next step's float(loss)
        method.settle()
        assert method.timers["comm"] >= SlowNccl.SECONDS * (step + 1), method.timers
    want = float(comm.size * (comm.size + 1) / 2) * comm.size ** 2
    assert np.all(flat.data == want), flat.data[:3]
    method.close()


class FailingIdNccl(FakeNccl):
    @staticmethod
    def get_unique_id():
        raise RuntimeError("ncclGetUniqueId failed: unhandled system error")


def nccl_lifecycle_every_communicator_is_destroyed(comm):
    """Issue 25, finding 7: the start-up check's own reducer and the one the fallback replaces
    were never destroyed; now every NCCL communicator made is destroyed once."""
    from scalesgd.methods.gradients import SummedGradients
    FakeNccl.live = 0
    flat = dd.ndarray(np.zeros(layout().size, np.float32))
    red = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=FakeNccl)
    assert FakeNccl.live == 1
    method = SummedGradients(MPITransport(comm), dist(servers=1), {"comm": 0.0, "wait": 0.0})
    method.engine = red
    method.use_host_transport()                   # the start-up check failed it
    assert FakeNccl.live == 0 and type(method.engine).transport == "host"
    method.close()
    red.close()                                   # a second close is a no-op
    assert FakeNccl.live == 0


def nccl_id_failure_on_rank0_ends_every_rank(comm):
    """Issue 25, finding 7: when rank 0 cannot make the NCCL id, the others used to wait in Bcast
    for an id that never came while rank 0 went on; now every rank raises the same error."""
    from scalesgd.errors import BackendError
    flat = dd.ndarray(np.zeros(layout().size, np.float32))
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
    """Issue 38, defect 1: since CuPy 14 ``get_unique_id()`` returns ``bytes`` and
    ``NcclCommunicator`` takes only ``bytes``; the id used to be turned into a tuple of ints, which
    CuPy 14 refuses with TypeError on every rank (so ``auto``, which prefers NCCL, died at attach).
    Every rank now gets rank 0's 128 bytes unchanged (bytes above 127 included)."""
    flat = dd.ndarray(np.zeros(layout().size, np.float32))
    red = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=FakeNccl)
    assert red.nccl_comm.args == (comm.size, dd.Nccl.get_unique_id(), comm.rank)
    assert red.overlap is False and red.transport == "nccl"
    red.ready([s.name for s in layout().specs])
    assert red.requests == [], "nccl: nothing started during backward"
    red.close()


def nccl_id_of_cupy13_is_passed_as_its_tuple(comm):
    """A machine's preinstalled CuPy 13: its tuple of signed chars reaches every rank as that tuple."""
    flat = dd.ndarray(np.zeros(layout().size, np.float32))
    red = device.NcclAllreduce(comm, flat, layout(), 4000, overlap=True, nccl=Cupy13Nccl)
    assert red.nccl_comm.args == (comm.size, Cupy13Nccl.get_unique_id(), comm.rank)
    assert min(red.nccl_comm.args[1]) < 0 <= max(red.nccl_comm.args[1])


def nccl_double_sums_every_ranks_buffer(comm):
    """The NCCL double with as many ranks as the job (``NcclCommunicator(ndev = size, ...)``):
    each rank's queued allReduce sums every rank's buffer once the streams run (it once summed
    one process only: ``ndev`` 1)."""
    dd.reset()
    uid = comm.bcast(dd.Nccl.get_unique_id() if comm.rank == 0 else None, root=0)
    nc = dd.Nccl.NcclCommunicator(comm.size, uid, comm.rank)
    send = dd.ndarray(np.full(5, comm.rank + 1.0, np.float32))
    recv = dd.ndarray(np.zeros(5, np.float32))
    dd.Nccl.arrays = {send.data.ptr: send.data, recv.data.ptr: recv.data}
    nc.allReduce(send.data.ptr, recv.data.ptr, 5, dd.Nccl.NCCL_FLOAT32, dd.Nccl.NCCL_SUM, 0)
    assert np.all(recv.data == 0), "queued: nothing summed before the stream runs"
    dd.cuda.get_current_stream().synchronize()
    assert np.all(recv.data == comm.size * (comm.size + 1) / 2), recv.data
    nc.destroy()


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    dd.install()
    run_checks(choice_is_the_same_on_every_rank, named_transport_some_rank_cannot_use_fails_everywhere,
               numpy_buffers_use_host_directly, device_buffers_staged_per_bucket_with_overlap,
               nccl_reducer_gets_rank0_id_and_does_not_overlap, nccl_id_of_cupy13_is_passed_as_its_tuple,
               nccl_lifecycle_every_communicator_is_destroyed,
               nccl_id_failure_on_rank0_ends_every_rank, nccl_is_not_chosen_when_ranks_share_a_gpu,
               nccl_time_is_measured_on_the_device,
               buckets_start_before_the_barrier_however_far_each_device_got,
               nccl_double_sums_every_ranks_buffer)
