"""Transport and path selection on CPU, with injected probes (no mocks of MPI: COMM_SELF is real,
and tests/mpi/device_check.py runs the choice and the host staging on 2 ranks under mpiexec)."""
import logging
import os
import types
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from helpers import TINY, launch, one_line_error, run_cli
from mpirun import check, run_mpi, uses_mpi
from synth import make_dataset
from scalesgd import backend
from scalesgd.comm import staging
from scalesgd.comm.mpi import buckets, device
from scalesgd.comm.mpi.device import Probes
from scalesgd.errors import MethodError
from scalesgd.nn.params import Layout, TensorSpec

ROOT = Path(__file__).resolve().parents[1]
SELF = MPI.COMM_SELF


@pytest.mark.parametrize("requested,on_device,probes,transfer,expect", [
    ("auto", False, None, None, "host"),                                 # NumPy: nothing probed
    ("host", False, None, None, "host"),
    ("host", True, None, None, "host"),                                  # by name: nothing probed
    ("auto", True, Probes(True, True), True, "nccl"),
    ("auto", True, Probes(False, True), True, "cuda_aware_mpi"),
    ("auto", True, Probes(False, True), False, "host"),                  # test transfer failed
    ("auto", True, Probes(False, False), True, "host"),
    ("auto", True, Probes(False, None), True, "host"),                   # unknown: never risk it
    ("nccl", True, Probes(True, None), True, "nccl"),
    ("cuda_aware_mpi", True, Probes(True, None), True, "cuda_aware_mpi"),  # by name: tried anyway
])
def test_resolve(requested, on_device, probes, transfer, expect):
    ok = None if transfer is None else (lambda: transfer)
    assert device.resolve(SELF, requested, on_device, probes, ok)[0] == expect


@pytest.mark.parametrize("requested,on_device,probes,transfer,words", [
    ("nccl", False, None, None, "NumPy"),
    ("cuda_aware_mpi", False, None, None, "NumPy"),
    ("nccl", True, Probes(False, True), True, "no NCCL bindings"),
    ("cuda_aware_mpi", True, Probes(False, True), False, "test all-reduce"),
    ("gloo", True, Probes(False, True), True, "expected one of"),
])
def test_named_transport_that_cannot_run_is_an_error(requested, on_device, probes, transfer, words):
    with pytest.raises(MethodError, match=words) as info:
        device.resolve(SELF, requested, on_device, probes, lambda: transfer)
    assert str(info.value).startswith("dist.allreduce_transport") and "\n" not in str(info.value)


def test_failed_test_transfer_falls_back_loudly():
    t, why = device.resolve(SELF, "auto", True, Probes(False, True), lambda: False)
    assert t == "host" and "falling back" in why


def test_transfer_not_tried_unless_mpi_says_yes():
    tried = []
    device.resolve(SELF, "auto", True, Probes(False, False), lambda: tried.append(1) or True)
    assert not tried


def test_named_cuda_aware_mpi_is_not_probed_where_the_mpi_says_it_is_not_cuda_aware():
    """Issue 38, defect 3: by name, ``cuda_aware_mpi`` handed a device buffer to MPI whatever its
    library said; an MPI built without CUDA (the mpich wheel's: "CUDA not enabled") crashes on it
    with SIGSEGV, which no ``try`` catches.  A library that says no is now an error, unprobed."""
    tried = []
    with pytest.raises(MethodError, match="says it is not CUDA-aware") as info:
        device.resolve(SELF, "cuda_aware_mpi", True, Probes(False, False), lambda: tried.append(1) or True)
    assert not tried and "\n" not in str(info.value)


def test_the_parity_script_probes_cuda_aware_mpi_only_where_every_mpi_claims_cuda(monkeypatch, capsys):
    """Issue 38, defect 3: tests/gpu/allreduce_parity.py (gpu_check's all-reduce section) asked for
    ``cuda_aware_mpi`` by name, so the device pointer reached an MPI that never claimed CUDA support
    (here: a library without the query).  Run in-process on one rank with the device double as
    CuPy: host staging is summed, ``cuda_aware_mpi`` is named skipped and never probed."""
    import importlib.util

    import device_double
    device_double.install(monkeypatch)
    spec = importlib.util.spec_from_file_location("allreduce_parity", ROOT / "tests/gpu/allreduce_parity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "BACKEND", "cupy")
    monkeypatch.setattr(mod, "TIME", False)
    probed = []
    monkeypatch.setattr(device, "transfer_works", lambda comm: probed.append(1) or False)
    monkeypatch.setattr(device, "mpi_cuda_query", lambda: None)       # an MPI without the query
    mod.transports_sum_to_the_closed_form(SELF)
    out = capsys.readouterr().out
    assert not probed, "a device buffer was handed to an MPI that never claimed CUDA support"
    assert "transport host: sums agree" in out and "skipped transport cuda_aware_mpi: the MPI" in out, out
    assert "skipped transport nccl:" in out


def test_factory_table_and_one_rank():
    assert set(device.ALLREDUCERS) == {"host", "cuda_aware_mpi", "nccl"}
    assert [device.ALLREDUCERS[n].transport for n in ("host", "cuda_aware_mpi", "nccl")] == \
        ["host", "cuda_aware_mpi", "nccl"]
    assert not device.NcclAllreduce.can_overlap and not device.CudaAwareAllreduce.can_overlap
    lay = Layout([TensorSpec("a", (3,)), TensorSpec("b", (4,))])
    flat = np.arange(7.0)
    d = types.SimpleNamespace(allreduce_transport="nccl", bucket_mb=0.0, overlap=True)
    red = device.create_allreducer(SELF, flat, lay, d)     # one rank: host, nothing probed
    assert type(red) is buckets.BucketedAllreduce and red.buf is flat and red.overlap


def test_overlap_not_honoured_is_said(caplog):
    """The nccl transport cannot overlap backward: the choice's log line says so (rank 0)."""
    red = types.SimpleNamespace(overlap=False)
    with caplog.at_level(logging.INFO, logger="scalesgd"):
        device.log_choice("nccl", "CuPy NCCL bindings on every rank", True, True, red)
    text = caplog.text
    assert "allreduce transport: nccl" in text and "dist.overlap is not honoured by the nccl" in text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scalesgd"):
        device.log_choice("host", "host (NumPy) buffers", False, True, types.SimpleNamespace(overlap=True))
    assert caplog.text == "", "NumPy buffers: no line, as before"


DEVICE_CHECKS = 12            # the checks tests/mpi/device_check.py runs


@uses_mpi
def test_transports_on_two_ranks():
    out = check(run_mpi(2, ["tests/mpi/device_check.py"], timeout=120))
    assert out.count(": ok") == DEVICE_CHECKS, out


@uses_mpi
def test_named_device_transport_on_cpu_run_is_one_line_error(tmp_path):
    """The real program on 2 ranks with NumPy gradients and a device transport by name: every rank
    raises the same error in the method's set-up, rank 0 prints it once, nothing is written."""
    data = make_dataset(tmp_path / "data", n=32, n_val=8, num_classes=4)
    run_dir = tmp_path / "run"
    p = run_cli(["--method", "allreduce", "--device", "cpu", "--allreduce-transport", "nccl",
                 "--data", str(data), "--run-dir", str(run_dir), *TINY], tmp_path, launcher=launch(2))
    one_line_error(p, "dist.allreduce_transport = nccl", "NumPy")
    assert not run_dir.exists()


def test_probes_on_this_machine():
    assert device.mpi_cuda_query() in (True, False, None)
    assert device.nccl_module() is None or hasattr(device.nccl_module(), "NcclCommunicator")
    p = Probes.of_this_rank()
    assert p.mpi_cuda_query in (True, False, None)


def test_host_stage_is_the_array_itself_on_numpy():
    a = np.arange(5.0)
    st = staging.HostStage(a)
    assert st.host is a and st.to_host() is a
    st.to_device()
    staging.sync_stream(a)                       # no-op on NumPy


def test_set_precision(monkeypatch):
    # (set, then removed: monkeypatch records the variable and removes what set_precision sets after
    # the test; delenv of an absent one records nothing, and CUPY_TF32=1 outlived it in the worker)
    monkeypatch.setenv("CUPY_TF32", "0")
    monkeypatch.delenv("CUPY_TF32")
    backend.set_precision("fp32")
    assert "CUPY_TF32" not in os.environ
    backend.set_precision("tf32")
    assert os.environ["CUPY_TF32"] == "1"
    with pytest.raises(backend.BackendError):
        backend.set_precision("fp16")


def test_config_keys():
    from scalesgd import config as C
    cfg = C.build(None, {"model": {"conv_impl": "im2col", "precision": "bf16"},
                         "dist": {"allreduce_transport": "cuda_aware_mpi"}})
    assert cfg.model.conv_impl == "im2col" and cfg.model.precision == "bf16"
    assert cfg.dist.allreduce_transport == "cuda_aware_mpi" \
        and C.build(None).dist.allreduce_transport == "auto"
    with pytest.raises(C.ConfigError):
        C.build(None, {"model": {"conv_impl": "winograd"}})
    with pytest.raises(C.ConfigError, match="allreduce_transport"):
        C.build(None, {"dist": {"allreduce_transport": "gloo"}})


def test_host_stage_to_device_leaves_the_host_buffer_free(monkeypatch):
    """Issue 25, finding 2: CuPy's ``set()`` from pinned memory only enqueues the copy, which reads
    the host buffer when the stream runs it; the EASGD server received the next push into that same
    buffer right after ``to_device()``, so the center could take the next worker's values.  On the
    device double (tests/device_double.py) the host buffer is overwritten as MPI would, right after
    ``to_device()`` returns: the device must hold what was staged."""
    import device_double
    cp = device_double.install(monkeypatch)
    dev = cp.ndarray(np.zeros(6, np.float32))
    st = staging.HostStage(dev)
    assert st.host is not dev
    st.host[...] = np.arange(6)
    st.to_device()
    st.host[...] = -9.0                          # the next receive lands in the staging buffer
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(dev.data, np.arange(6))
    dev.data[...] = 7.0                          # and the other way: to_host is synchronous
    assert np.all(st.to_host() == 7.0)


class NoNonBlocking:
    """COMM_SELF whose non-blocking collectives fail, as Open MPI's do on device memory (a crash
    there; an exception here); counts the blocking all-reduces."""

    def __init__(self):
        self.comm, self.blocking = MPI.COMM_SELF, 0

    def Iallreduce(self, *args, **kw):
        raise RuntimeError("non-blocking collective on device memory")

    def Allreduce(self, *args, **kw):
        self.blocking += 1
        return self.comm.Allreduce(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.comm, name)


def test_cuda_aware_transport_uses_only_the_blocking_collective_its_probe_tested():
    """Issue 25, finding 5: the probe (``transfer_works``) tests a blocking Allreduce of a device
    array, but the transport started an Iallreduce per bucket during backward."""
    from scalesgd.nn.params import Layout, TensorSpec
    lay = Layout([TensorSpec(f"t{i}", (100 + i,)) for i in range(5)])
    flat = np.arange(lay.size, dtype=np.float32)
    comm = NoNonBlocking()
    red = device.CudaAwareAllreduce(comm, flat, lay, 200 * 4, overlap=True)
    assert not red.overlap and len(red.buckets) > 1
    for spec in reversed(lay.specs):
        red.ready([spec.name])
    red.finish()
    assert comm.blocking == len(red.buckets)
    np.testing.assert_array_equal(flat, np.arange(lay.size, dtype=np.float32))   # one rank: the sum


def test_the_device_double_checks_get_and_set_as_cupy_14_does(monkeypatch):
    """``get(out=)`` and ``set()`` refuse what CuPy 14 refuses (``cupy/_core/core.pyx``): another
    dtype, another shape, a non-contiguous buffer, a non-NumPy one; the lax double copied any of
    them (a float64 host buffer staged into float32 gradients passed here and failed on a GPU)."""
    import device_double as dd
    cp = dd.install(monkeypatch)
    a = cp.ndarray(np.zeros((4, 6), np.float32))
    for bad, err in ((np.zeros((4, 6), np.float64), TypeError), (np.zeros((6, 4), np.float32), ValueError),
                     (np.zeros((4, 12), np.float32)[:, ::2], RuntimeError), ([0.0] * 24, TypeError)):
        with pytest.raises(err):
            a.get(out=bad)
        if err is not RuntimeError:                 # (set takes a strided host array, as CuPy does)
            with pytest.raises(err):
                a.set(bad)
    with pytest.raises(RuntimeError, match="non-contiguous"):
        cp.ndarray(np.zeros((4, 12), np.float32))[:, ::2].set(np.zeros((4, 6), np.float32))
    good = np.arange(24, dtype=np.float32).reshape(4, 6)
    a.set(good)
    assert np.array_equal(a.get(), good) and np.array_equal(a.get(out=np.empty((4, 6), np.float32)), good)


def test_staging_takes_pinned_buffers_from_the_device_doubles_cupyx(monkeypatch):
    """The double has ``cupyx`` now: staging's pinned path runs (before, every test staged through
    pageable buffers, the fallback); ``pinned=False`` keeps the fallback's test."""
    import device_double as dd
    cp = dd.install(monkeypatch)
    st = staging.HostStage(cp.ndarray(np.zeros(8, np.float32)))
    assert dd.is_pinned(st.host) and st.host.dtype == np.float32 and st.host.shape == (8,)
    cp = dd.install(monkeypatch, pinned=False)
    st = staging.HostStage(cp.ndarray(np.zeros(8, np.float32)))
    assert not dd.is_pinned(st.host)
