"""easgd and asgd (parameter server on rank 0) under real mpiexec; every launch has a timeout."""
import json
import time

import pytest

from mpirun import check, mpi_launcher, needs_mpi, run_mpi
from synth import make_dataset
from helpers import TINY, bad_sample_warnings, one_line_error, run_cli

pytestmark = [pytest.mark.mpi, needs_mpi]
CHECKS = 8                                       # functions run by tests/mpi/server_check.py


@pytest.mark.parametrize("ranks", [2, 4])       # one worker (no staleness), three (3 ranks: a subset)
def test_server_invariants(ranks):
    """Exact update sums, hand-computed easgd, conservation, staleness, 24 short runs that end."""
    out = check(run_mpi(ranks, ["tests/mpi/server_check.py"], timeout=240))   # a hang guard: Open MPI
    # oversubscribed on 2 cores needs over 90 s for the 8 checks at 4 ranks
    assert out.count(": ok") == CHECKS, out


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tiny"), n=48, n_val=20, num_classes=4)


@pytest.mark.parametrize("method,extra,boundaries", [
    ("easgd", [], [48]),
    ("easgd", ["--tau", "3", "--eval-every", "0.5"], [24, 48]),
    ("asgd", ["--n-sync", "3"], [48]),
    ("asgd", ["--eval-every", "0.5", "--epochs", "2"], [24, 48, 72, 96]),
])
def test_cli_run_ends_and_writes_summary(tmp_path, tiny_data, method, extra, boundaries):
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(run_dir), "--method", method, *TINY,
                 *extra], tmp_path, timeout=90, launcher=mpi_launcher(3))
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["method"], s["ranks"], s["workers"]) == (method, 3, 2)
    assert [h["global_samples"] for h in s["history"]] == boundaries
    # a push follows at least one local step of 8 samples (and each of the 2 workers may push once
    # more before a reply tells it of the phase), and a push is never staler than the versions the
    # server had applied
    assert all(0 < h["server_version"] <= h["global_samples"] // 8 + 2 and
               0 <= h["staleness_max"] < h["server_version"] for h in s["history"]), \
        [(h["global_samples"], h["server_version"], h["staleness_max"]) for h in s["history"]]
    last_known = []
    for rank in (1, 2):
        rows = [json.loads(ln)
                for ln in (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r["kind"] == "step"]
        assert steps[-1]["exchanges"] >= 1
        assert "staleness" in steps[-1] and "wait_seconds" in steps[-1]
        last_known.append(steps[-1]["global_samples"])
    # the server enters the last phase once every worker was told a count >= the end; a worker
    # joins it as soon as any rank asks, so only the furthest one surely knows the end was reached
    assert max(last_known) >= boundaries[-1]


def test_one_rank_is_refused_fast(tmp_path, tiny_data):
    t = time.perf_counter()
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(tmp_path / "run"), "--method", "easgd",
                 *TINY], tmp_path, timeout=60, launcher=mpi_launcher(1))
    one_line_error(p, "easgd", "at least 2 ranks")
    assert time.perf_counter() - t < 45           # refused before training (a run takes minutes);
                                                  # (start-up alone is seconds on a loaded machine)
    assert not (tmp_path / "run").exists()


def test_workers_skip_bad_samples_and_the_job_ends(tmp_path):
    """Every sample of shard 1 is a bad JPEG: the workers replace each one they meet, warn about
    it, and the run (server included) ends normally with the count in the summary."""
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4, bad=range(24, 48))
    p = run_cli(["--data", str(root), "--run-dir", str(tmp_path / "run"), "--method", "asgd", *TINY],
                tmp_path, timeout=60, launcher=mpi_launcher(3))
    lines = bad_sample_warnings(p, "train-00001-of-00002.h5[")
    assert all("rank 1:" in ln or "rank 2:" in ln for ln in lines), lines
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["bad_samples"] == len(lines) >= 1
