"""slurm/gossip_64.sh under a real (one-node, throw-away) Slurm: sbatch, srun --mpi=pmi2, 4 ranks.

Installs slurm-wlm + munge with apt when absent (CI runs as root), else skips saying why.  Every
step has a timeout; the cluster is torn down even when a test fails.
"""
import json
import re
import sys
import time
from pathlib import Path

import pytest

from slurm_cluster import Cluster, ensure_installed
from synth import make_dataset

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slurm

TINY_JOB = """[model]
model = "resnet20"
width = 0.25
[data]
image_size = 16
batch_size = 8
scale = [16.0, 20.0]
[train]
method = "gossip"
epochs = 1
log_every = 1
"""


def job_state(cluster, job: str) -> str:
    out = cluster.run(["scontrol", "show", "job", job], timeout=10).stdout
    m = re.search(r"JobState=(\w+)", out)
    return m.group(1) if m else "UNKNOWN"


def wait_for_job(cluster, job: str, timeout: float) -> str:
    """Polls (sbatch --wait polls too slowly) until the job leaves PENDING/RUNNING/COMPLETING;
    on timeout cancels it and fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(cluster, job)
        if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED"):
            return state
        time.sleep(0.5)
    cluster.run(["scancel", "--full", job], timeout=10)
    pytest.fail(f"Slurm job {job} still {state} after {timeout}s:\n{cluster.logs()}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = ensure_installed()
    if reason:
        pytest.skip(reason)
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed in this Python")
    with Cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


@pytest.fixture(scope="module")
def gossip_job(cluster, tmp_path_factory):
    """Runs slurm/gossip_64.sh shrunk to 1 node x 4 tasks; returns (job id, run dir, log text)."""
    tmp = tmp_path_factory.mktemp("gossip64")
    (tmp / "tiny.toml").write_text(TINY_JOB)
    data = make_dataset(tmp / "data", n=96, n_val=24, num_classes=4)
    env = dict(cluster.env, CONFIG=str(tmp / "tiny.toml"), DATA=str(data), VENV=sys.prefix,
               SCALESGD_PMI="pmi2", RUNS=str(tmp / "runs"), EXTRA_ARGS="--eval-every 0.5")
    cmd = ["sbatch", "--parsable", "--nodes=1", "--ntasks=4", "--ntasks-per-node=4",
           "--cpus-per-task=1", "--gres=none", "--time=10", f"--output={tmp}/%x-%j.out",
           "slurm/gossip_64.sh"]
    p = cluster.run(cmd, timeout=30, env=env, cwd=ROOT)
    job = p.stdout.strip().split(";")[0]
    state = wait_for_job(cluster, job, timeout=120) if job.isdigit() else "not submitted"
    logs = "\n".join(f.read_text(errors="replace") for f in tmp.glob("*.out"))
    report = f"final state {state}; sbatch rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}\njob log:\n{logs}\n{cluster.logs()}"
    assert job.isdigit(), report
    return job, tmp / "runs" / f"gossip_64-{job}", report


def test_gossip_64_script_completes_on_one_node_with_4_ranks(cluster, gossip_job):
    job, run_dir, report = gossip_job
    state = cluster.run(["scontrol", "show", "job", job]).stdout
    assert re.search(r"JobState=COMPLETED\b", state), f"{state}\n{report}"
    assert "ExitCode=0:0" in state, report
    files = sorted(p.name for p in (run_dir / "metrics").glob("rank-*.jsonl"))
    assert files == [f"rank-{r}.jsonl" for r in range(4)], report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "gossip" and summary["ranks"] == 4, summary
    for r in range(4):
        kinds = {json.loads(ln)["kind"] for ln in (run_dir / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()}
        assert {"step", "val"} <= kinds, (r, kinds)


def test_gossip_64_script_leaves_a_checkpoint(gossip_job):
    from scalesgd.io import checkpoint as ckpt
    _, run_dir, report = gossip_job
    files = ckpt.listing(ckpt.checkpoint_dir(run_dir))
    assert files, report
    meta = ckpt.verify(files[-1])
    assert (meta["method"], meta["ranks"], meta["reason"]) == ("gossip", 4, "end"), meta


def test_signal_checkpoints_requeues_and_the_job_finishes(cluster, tmp_path):
    """The time-limit warning (here sent by hand: scancel --signal=USR1 --batch) reaches the batch
    script, which forwards it to the ranks; they checkpoint and exit 75; the script requeues the job,
    which resumes from the checkpoint in the same run directory and completes.  Launched with
    SCALESGD_LAUNCHER=mpirun: with srun --mpi=pmi2 the requeued attempt trains to the end and writes
    its summary, but srun then fails the step ("mpi/pmi2: failed to send temp kvs"; docs/slurm.md)."""
    from scalesgd.io import checkpoint as ckpt
    (tmp_path / "long.toml").write_text(TINY_JOB.replace("epochs = 1", "epochs = 30"))
    data = make_dataset(tmp_path / "data", n=96, n_val=24, num_classes=4)
    env = dict(cluster.env, CONFIG=str(tmp_path / "long.toml"), DATA=str(data), VENV=sys.prefix,
               SCALESGD_PMI="pmi2", RUNS=str(tmp_path / "runs"),
               EXTRA_ARGS="--straggler 0:25 --eval-every 10", SCALESGD_LAUNCHER="mpirun")
    p = cluster.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=4", "--ntasks-per-node=4",
                     "--cpus-per-task=1", "--gres=none", "--time=10", f"--output={tmp_path}/%x-%j.out",
                     "slurm/gossip_64.sh"], timeout=30, env=env, cwd=ROOT)
    job = p.stdout.strip().split(";")[0]
    assert job.isdigit(), p.stderr
    run_dir = tmp_path / "runs" / f"gossip_64-{job}"
    metrics = run_dir / "metrics" / "rank-0.jsonl"
    deadline = time.monotonic() + 90
    while not (metrics.exists() and metrics.read_text().count('"step"') >= 5):
        assert time.monotonic() < deadline, "no progress:\n" + "\n".join(
            f.read_text(errors="replace") for f in tmp_path.glob("*.out"))
        time.sleep(0.3)
    cluster.run(["scancel", "--signal=USR1", "--batch", job], timeout=10)
    # Slurm may hold a requeued job back (BeginTime in the future); make it eligible at once
    deadline = time.monotonic() + 90
    while "Restarts=1" not in cluster.run(["scontrol", "show", "job", job], timeout=10).stdout:
        assert time.monotonic() < deadline, f"job {job} was not requeued:\n{cluster.logs()}"
        time.sleep(0.3)
    if job_state(cluster, job) == "PENDING":          # (only a pending job may be touched)
        cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=10)
    state = wait_for_job(cluster, job, timeout=120)
    logs = "\n".join(f.read_text(errors="replace") for f in tmp_path.glob("*.out"))
    assert state == "COMPLETED", f"{state}\n{logs}\n{cluster.logs()}"
    assert "got SIGUSR1, forwarding to the ranks" in logs and "requeueing job" in logs, logs
    assert "resuming from" in logs, logs
    reasons = [ckpt.read_meta(f)["reason"] for f in ckpt.listing(ckpt.checkpoint_dir(run_dir))]
    assert "stop" in reasons and reasons[-1] == "end", (reasons, logs)
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 30
