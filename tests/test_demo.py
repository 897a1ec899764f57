"""The built-in demo, end to end, exactly as `make demo` runs it (4 MPI ranks, all-reduce,
jobs/digits-allreduce.toml, 8 epochs): >= 97% validation top-1; and every other method's job."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.mpi
def test_demo_reaches_97_percent(tmp_path):
    """The README's first command, `make demo`: mpiexec -n 4 ... --config jobs/digits-allreduce.toml
    (its whole 8 epochs).  It also stands for all-reduce in the per-method check below."""
    from mpirun import check, needs_mpi, run_mpi
    if needs_mpi.args[0]:
        pytest.skip("no mpiexec")
    run_dir = tmp_path / "run"
    check(run_mpi(4, ["-m", "src.main", "--config", "jobs/digits-allreduce.toml", "--run-dir", str(run_dir),
                      "--log-every", "1000"], timeout=900, env={"SCALESGD_DATA": str(tmp_path / "digits")}))
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["method"] == "allreduce" and s["ranks"] == 4 and s["epochs"] == 8
    assert s["val_top1_accuracy"] >= 0.97, s["history"]
    assert s["samples"] == s["epochs"] * (1438 // s["global_batch"]) * s["global_batch"]


METHODS_ON_4 = ["easgd", "asgd", "gossip", "localsgd"]     # allreduce: the demo above
# 3 of the jobs' 8 epochs (the cosine schedule then spans 3): an end-to-end check that each
# method trains on its job's settings; the methods' arithmetic is checked by their invariants tests.
# Measured at 3 epochs (2 cores, 4 ranks, 16-24 s each beside other work; 2026-12-05):
#   easgd 95.8, 97.8, 96.9, 96.9, 96.9%; asgd 96.9, 96.7, 96.9, 96.7, 97.2%;
#   gossip 95.5, 96.1, 96.1, 94.2, 96.7%; localsgd 95.5, 95.5% (it is deterministic).
# (At 6 epochs, as before: 97.2-98.3%, at twice the cost: 54-67 s each in the suite on a slow day.
# localsgd's full 12-epoch job: 99.16%, the closing note of its issue.)
EPOCHS_ON_4 = 3
# The bar: 90% for every method, about 4 points under the lowest run above (the asynchronous
# methods' exchange order varies from run to run).  A broken method lands far below it (chance is
# 10%).
MIN_ACCURACY = 0.90


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("method", METHODS_ON_4)
def test_each_method_trains_the_digits_on_4_ranks(tmp_path, method):
    """jobs/digits-METHOD.toml for EPOCHS_ON_4 epochs under mpiexec -n 4 (2 cores: oversubscribed)
    reaches MIN_ACCURACY."""
    from mpirun import check, needs_mpi, run_mpi
    if needs_mpi.args[0]:
        pytest.skip("no mpiexec")
    run_dir = tmp_path / "run"
    check(run_mpi(4, ["-m", "src.main", "--config", f"jobs/digits-{method}.toml", "--run-dir",
                      str(run_dir), "--log-every", "1000", "--epochs", str(EPOCHS_ON_4)], timeout=600,
                  env={"SCALESGD_DATA": str(tmp_path / "digits")}))
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["method"] == method and s["ranks"] == 4 and s["epochs"] == EPOCHS_ON_4
    assert s["val_top1_accuracy"] >= MIN_ACCURACY, s["history"]


@pytest.mark.slow
@pytest.mark.mpi
# (A-SGD's ending is the server protocol's, which EASGD's runs here exercise through the program
# and tests/mpi/server_check.py's short runs drive for both methods under both MPI libraries; it
# took a fifth of this test's time, cut to keep the suite under 10 minutes.)
@pytest.mark.parametrize("method,knob", [("easgd", "--tau"), ("gossip", "--tau")])
def test_async_methods_terminate_6_times_in_a_row(tmp_path_factory, method, knob):
    """6 short real runs (3 ranks, tiny data, varied seed, exchange period, evaluation period, a
    straggler and, for gossip, pull or push: the period and evaluation cycle with i mod 3, the
    straggler with i mod 2, the variant with i // 3, so the 6 runs meet every combination of the
    period with the straggler and with the variant) each end with exit 0 on every rank and a
    summary, never a hang.  (12 runs, every triple, took 15 s per method; the methods' termination
    without MPI's timing is also run in the virtual cluster by every survival and resume test.)"""
    from mpirun import mpi_launcher, mpiexec
    from synth import make_dataset
    from helpers import TINY, run_cli
    if mpiexec() is None:
        pytest.skip("no mpiexec")
    tmp = tmp_path_factory.mktemp(method)
    data = make_dataset(tmp / "d", n=48, n_val=12, num_classes=4)
    for i in range(6):
        run_dir = tmp / f"run{i}"
        extra = ["--seed", str(i), knob, str(1 + i % 3), "--eval-every", ("1", "0.5", "0.3")[i % 3]]
        if i % 2 == 1:
            extra += ["--straggler", f"{1 + i % 3 % 2}:20:10"]
        if method == "gossip":
            extra += ["--gossip", ("pull", "push")[i // 3]]
        p = run_cli(["--data", str(data), "--run-dir", str(run_dir), "--method", method, *TINY, *extra],
                    tmp, timeout=60, launcher=mpi_launcher(3))
        assert p.returncode == 0, f"run {i} {extra}:\n{p.stdout}\n{p.stderr}"
        assert (run_dir / "summary.json").exists(), f"run {i}"
