"""Transport and path selection on CPU, with injected probes (no mocks of MPI: COMM_SELF is real)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from scalesgd import backend
from scalesgd.comm import collectives, device
from scalesgd.comm.device import Probes, choose

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("probes,coll,expect", [
    (Probes(False, True, True), "allreduce", "host_staging"),          # NumPy buffers
    (Probes(True, True, True), "allreduce", "nccl"),
    (Probes(True, True, True), "gossip", "cuda_aware_mpi"),            # NCCL only for allreduce
    (Probes(True, False, True), "allreduce", "cuda_aware_mpi"),
    (Probes(True, False, False), "allreduce", "host_staging"),
    (Probes(True, False, None), "allreduce", "host_staging"),          # unknown: never risk it
    (Probes(True, False, None, True), "server", "cuda_aware_mpi"),     # forced by env
    (Probes(True, False, True, False), "server", "host_staging"),      # forbidden by env
])
def test_choose(probes, coll, expect):
    assert choose(probes, coll, lambda: True)[0] == expect


def test_failed_test_transfer_falls_back_loudly():
    t, why = choose(Probes(True, False, True), "allreduce", lambda: False)
    assert t == "host_staging" and "fallback" in why


def test_transfer_not_tried_unless_mpi_says_yes():
    tried = []
    choose(Probes(True, False, False), "allreduce", lambda: tried.append(1) or True)
    assert not tried


def test_agree_and_select_on_comm_self(monkeypatch):
    assert device.agree(MPI.COMM_SELF, "nccl") == "nccl"
    monkeypatch.setattr(device, "_CHOSEN", {})
    assert device.select(MPI.COMM_SELF, False) == "host_staging"
    got = device.select(MPI.COMM_SELF, True, "server", Probes(True, False, False))
    assert got == "host_staging" and device._CHOSEN[("server", True)] == "host_staging"


def test_probes_on_this_machine(monkeypatch):
    assert device.mpi_cuda_query() in (True, False, None)
    monkeypatch.setenv("SCALESGD_CUDA_AWARE_MPI", "0")
    assert device.env_force() is False
    monkeypatch.setenv("SCALESGD_CUDA_AWARE_MPI", "1")
    assert device.env_force() is True
    monkeypatch.delenv("SCALESGD_CUDA_AWARE_MPI")
    assert device.env_force() is None


def test_host_stage_and_bucketed_allreduce_unchanged_on_host():
    a = np.arange(5.0)
    st = collectives.HostStage(a, device_ok=True)
    assert st.host is a and st.to_host() is a
    device.sync_stream(a)                       # no-op on NumPy


def test_set_precision(monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    backend.set_precision("fp32")
    assert "CUPY_TF32" not in os.environ
    backend.set_precision("tf32")
    assert os.environ["CUPY_TF32"] == "1"
    with pytest.raises(backend.BackendError):
        backend.set_precision("fp16")


def test_config_keys():
    from scalesgd import config as C
    cfg = C.build(None, {"model": {"conv_impl": "im2col", "precision": "bf16"}})
    assert cfg.model.conv_impl == "im2col" and cfg.model.precision == "bf16"
    with pytest.raises(C.ConfigError):
        C.build(None, {"model": {"conv_impl": "winograd"}})


def test_gpu_check_dry_run(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parity sgd_update(nesterov)" in r.stdout and "| 2 | im2col |" in r.stdout
    assert (tmp_path / "gpu_check.json").exists() and (tmp_path / "gpu_check.md").exists()
