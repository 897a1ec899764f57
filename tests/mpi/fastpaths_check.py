"""The fast-path self-check across ranks, run as ``mpiexec -n 2 python tests/mpi/fastpaths_check.py``:
ranks agree on what failed (and only rank 0 says it), strict fails every rank alike, and the
all-reduce check (a collective) replaces a wrong transport by the host one.  The transports are the
real reducer classes on NumPy buffers (CudaAwareAllreduce's code runs on host memory too); the wrong
one is a host reducer that adds 1 after summing."""
import logging
import types

import numpy as np
from harness import run_checks
from mpi4py import MPI

from scalesgd import fastpaths as F
from scalesgd.comm.mpi import buckets, device
from scalesgd.comm.mpi.transport import MPITransport
from scalesgd.errors import BackendError
from scalesgd.methods.gradients import SummedGradients
from scalesgd.nn.resnet import ResNet


class Lines(logging.Handler):
    """The scalesgd log lines this rank wrote."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []
        logging.getLogger("scalesgd").addHandler(self)
        logging.getLogger("scalesgd").setLevel(logging.INFO)

    def emit(self, record):
        self.lines.append(record.getMessage())


LOG = Lines()


def component(name, good: bool, disabled: list):
    x = np.arange(5.0)
    return F.Component(name, lambda: x + (0 if good else 1), lambda: x, 1e-9, f"{name}'s reference",
                       lambda: disabled.append(name))


def a_failure_on_one_rank_is_turned_off_on_every_rank(comm):
    disabled, r = [], comm.rank
    LOG.lines.clear()
    comps = [component("a", True, disabled), component("b", r == 0, disabled)]   # b fails on rank 1
    if r == 1:
        comps.append(component("only-on-rank-1", False, disabled))
    out = F.validate(comps, "auto", F.agree_over(MPITransport(comm)), speak=r == 0)
    assert disabled == (["b"] if r == 0 else ["b", "only-on-rank-1"]), disabled
    assert out["b"]["status"] == "fell back" and out["b"]["error"].startswith("rank 1: output 0:")
    warned = [ln for ln in LOG.lines if ln.startswith("warning:")]
    if r == 0:          # rank 0 says every failure once, also one of a component it does not have
        assert len(warned) == 2 and "fast path b " in warned[0] and "only-on-rank-1" in warned[1], warned
    else:
        assert warned == [], warned


def strict_fails_every_rank_alike(comm):
    try:
        F.validate([component("c", comm.rank == 0, [])], "strict", F.agree_over(MPITransport(comm)))
    except BackendError as exc:
        msg, shared = str(exc), exc.shared
    else:
        raise AssertionError("no error")
    assert shared and "fast path c failed its start-up check (rank 1: output 0:" in msg, msg
    assert comm.allgather(msg) == [msg] * comm.size


class Broken(buckets.BucketedAllreduce):
    """A wrong transport: the host sum, plus one."""

    transport = "broken"

    def _from_mpi(self) -> None:
        self.buf += 1
        super()._from_mpi()


def method_with(comm, transport_cls):
    """An ``allreduce`` method's gradient role (the real one; what the check reads of a method),
    whose all-reducer is ``transport_cls`` over a ResNet's gradients."""
    model = ResNet("resnet20", 10, 0.25, seed=0)
    gradients = SummedGradients(MPITransport(comm), None, {"comm": 0.0, "wait": 0.0})
    gradients.engine = transport_cls(comm, model.ps.grads, model.ps.layout, 10_000, True)
    return gradients, model


def a_broken_transport_falls_back_to_host(comm):
    method, model = method_with(comm, Broken)
    comp_buckets = method.engine.buckets
    (comp,) = F.transport_components(method)
    out = F.validate([comp], "auto", F.agree_over(MPITransport(comm)), speak=comm.rank == 0)
    assert out["allreduce broken"]["status"] == "fell back", out
    red = method.engine
    assert type(red) is buckets.BucketedAllreduce and red.flat is model.ps.grads and red.overlap
    assert red.buckets == comp_buckets                    # the same buckets as the device reducer had
    model.ps.grads[...] = comm.rank + 1.0                 # the new reducer sums the real gradients
    red.finish()
    assert np.all(model.ps.grads == comm.size * (comm.size + 1) / 2)


def a_sound_transport_is_used(comm):
    method, model = method_with(comm, device.CudaAwareAllreduce)
    comps = F.transport_components(method)
    out = F.validate(comps, "auto", F.agree_over(MPITransport(comm)))
    assert out["allreduce cuda_aware_mpi"]["status"] == "used", out
    assert out["allreduce cuda_aware_mpi"]["rel_error"] < 1e-6
    assert type(method.engine) is device.CudaAwareAllreduce
    host, _ = method_with(comm, buckets.BucketedAllreduce)
    assert F.transport_components(host) == []      # host is the reference: nothing to check


def a_numpy_run_only_agrees(comm):
    """train.device = auto (the default) on NumPy: no component, one agreement (a rank left on NumPy
    must meet the GPU ranks there), nothing timed, nothing said."""
    import scalesgd.config as C
    LOG.lines.clear()
    topo = types.SimpleNamespace(size=comm.size, transport=MPITransport(comm), is_root=comm.rank == 0)
    rep = F.check(C.build(None, {}), topo, ResNet("resnet20", 10, 0.25), types.SimpleNamespace(is_gpu=False))
    assert rep.to_dict() == {"mode": "auto", "seconds": 0.0, "gflops": 0.0, "components": {}}
    assert LOG.lines == []


if __name__ == "__main__":
    assert MPI.COMM_WORLD.size >= 2
    run_checks(a_failure_on_one_rank_is_turned_off_on_every_rank, strict_fails_every_rank_alike,
               a_broken_transport_falls_back_to_host, a_sound_transport_is_used, a_numpy_run_only_agrees)
