"""Waiting is reported apart from transfer: real runs under mpiexec with a straggler rank, read back
from the per-rank metrics files (docs/methods.md, "Timing split", defines wait and comm per method)."""
import json

import pytest

from helpers import TINY, run_cli
from mpirun import mpi_launcher, uses_mpi
from synth import make_dataset


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tiny"), n=48, n_val=20, num_classes=4)


def last_steps(run_dir, ranks):
    """{rank: its last step record}."""
    out = {}
    for r in ranks:
        rows = [json.loads(ln) for ln in (run_dir / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()]
        out[r] = [row for row in rows if row["kind"] == "step"][-1]
    return out


@uses_mpi
@pytest.mark.parametrize("method,ranks", [("gossip", 3), ("allreduce", 2)])
def test_a_straggler_shows_as_wait_on_the_other_ranks(tmp_path, tiny_data, method, ranks):
    """gossip: the counter updates (and failed pull tries) are wait, the exchange is comm;
    allreduce: the time until the slowest rank finished backward is wait.  Before, gossip and
    allreduce reported every blocked second as comm and wait_seconds = 0."""
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(run_dir), "--method", method, *TINY,
                 "--straggler", "1:30"], tmp_path, timeout=120, launcher=mpi_launcher(ranks))
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    steps = last_steps(run_dir, range(ranks))
    others = [steps[r] for r in range(ranks) if r != 1]
    assert any(s["wait_seconds"] > 0 for s in others), others
    for s in steps.values():
        assert s["comm_seconds"] > 0 and s["compute_seconds"] > 0, s
        assert s["wait_seconds"] + s["comm_seconds"] + s["compute_seconds"] <= s["train_seconds"], s
