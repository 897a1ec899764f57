"""slurm/gossip_64.sh under a real (one-node, throw-away) Slurm: sbatch, srun --mpi=pmi2, 4 ranks.

Installs slurm-wlm + munge with apt when absent (CI runs as root), else skips saying why.  Every
step has a timeout; the cluster is torn down even when a test fails.
"""
import json
import mmap
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
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


def documented_try_out() -> tuple[dict, list[str], str]:
    """The small try-out line of docs/slurm.md, as written: (its VAR=value prefix, the sbatch
    options, the script)."""
    lines = [ln for ln in (ROOT / "docs" / "slurm.md").read_text().splitlines() if "# a small try-out" in ln]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0].split("#")[0])
    at = words.index("sbatch")
    env = dict(w.split("=", 1) for w in words[:at])
    return env, words[at + 1:-1], words[-1]


def submit(cluster, options: list[str], out_dir: Path, **env) -> str:
    """sbatch OPTIONS slurm/gossip_64.sh from the repository root; returns the job id."""
    out_dir.mkdir(parents=True, exist_ok=True)
    p = cluster.run(["sbatch", "--parsable", *options, f"--output={out_dir}/%x-%j.out", "slurm/gossip_64.sh"],
                    timeout=30, env=dict(cluster.env, **env), cwd=ROOT)
    job = p.stdout.strip().split(";")[0]
    assert job.isdigit(), f"sbatch rc={p.returncode}: {p.stdout} {p.stderr}"
    return job


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
    """Runs slurm/gossip_64.sh with the sbatch options of the documented try-out (1 node x 4 tasks,
    no GPU) on the 16-CPU test node, on a tiny job file; returns (job id, run dir, log text)."""
    tmp = tmp_path_factory.mktemp("gossip64")
    (tmp / "tiny.toml").write_text(TINY_JOB)
    data = make_dataset(tmp / "data", n=96, n_val=24, num_classes=4)
    env = dict(cluster.env, CONFIG=str(tmp / "tiny.toml"), DATA=str(data), VENV=sys.prefix,
               SCALESGD_PMI="pmi2", RUNS=str(tmp / "runs"), EXTRA_ARGS="--eval-every 0.5")
    _, options, script = documented_try_out()
    cmd = ["sbatch", "--parsable", *options, f"--output={tmp}/%x-%j.out", script]
    p = cluster.run(cmd, timeout=30, env=env, cwd=ROOT)
    job = p.stdout.strip().split(";")[0]
    state = wait_for_job(cluster, job, timeout=120) if job.isdigit() else "not submitted"
    logs = "\n".join(f.read_text(errors="replace") for f in tmp.glob("*.out"))
    report = (f"final state {state}; sbatch rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}\n"
              f"job log:\n{logs}\n{cluster.logs()}")
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
        kinds = {json.loads(ln)["kind"]
                 for ln in (run_dir / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()}
        assert {"step", "val"} <= kinds, (r, kinds)


def test_gossip_64_script_leaves_a_checkpoint(gossip_job):
    from scalesgd.io import checkpoint as ckpt
    _, run_dir, report = gossip_job
    files = ckpt.listing(ckpt.checkpoint_dir(run_dir))
    assert files, report
    meta = ckpt.verify(files[-1])
    assert (meta["method"], meta["ranks"], meta["reason"]) == ("gossip", 4, "end"), meta


def test_easgd_on_8_gpu_nodes_script_runs_its_hierarchy_on_one_node(cluster, tmp_path):
    """slurm/easgd_8x8.sh (8 nodes x 8 GPUs, --hierarchy node) shrunk to one node without GPUs,
    1 server + 4 workers: under srun the ranks find their node through MPI, the server is a group
    of its own and the 4 workers one group whose leader alone talks to it; the job completes."""
    (tmp_path / "tiny.toml").write_text(TINY_JOB.replace('"gossip"', '"easgd"')
                                        + '[dist]\nhierarchy = "node"\n')
    data = make_dataset(tmp_path / "data", n=96, n_val=24, num_classes=4)
    env = dict(cluster.env, CONFIG=str(tmp_path / "tiny.toml"), DATA=str(data), VENV=sys.prefix,
               SCALESGD_PMI="pmi2", RUNS=str(tmp_path / "runs"))
    p = cluster.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=5", "--cpus-per-task=1", "--gres=none",
                     "--time=20", f"--output={tmp_path}/%x-%j.out", "slurm/easgd_8x8.sh"],
                    timeout=30, env=env, cwd=ROOT)
    job = p.stdout.strip().split(";")[0]
    assert job.isdigit(), f"sbatch rc={p.returncode}: {p.stdout} {p.stderr}"
    state = wait_for_job(cluster, job, timeout=120)
    log = "\n".join(f.read_text(errors="replace") for f in tmp_path.glob("*.out"))
    assert state == "COMPLETED", f"{state}\n{log}\n{cluster.logs()}"
    assert "easgd: node groups (dist.hierarchy = node): 2 group(s) of 1/4 rank(s)" in log, log
    summary = json.loads((tmp_path / "runs" / f"easgd_8x8-{job}" / "summary.json").read_text())
    assert summary["method"] == "easgd" and summary["ranks"] == 5, summary


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
    # (only a pending job may be touched; right after the requeue it may still be COMPLETING)
    deadline = time.monotonic() + 30
    while (state := job_state(cluster, job)) in ("REQUEUED", "COMPLETING", "CONFIGURING") \
            and time.monotonic() < deadline:
        time.sleep(0.3)
    if state == "PENDING":
        # the requeued attempt reuses the job id: started in the same second as the old attempt's
        # clean-up it once failed before its first line (a Slurm race, seen once on CI); let the
        # old allocation go first
        time.sleep(2)
        cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=10)
    state = wait_for_job(cluster, job, timeout=120)
    logs = "\n".join(f.read_text(errors="replace") for f in tmp_path.glob("*.out"))
    assert state == "COMPLETED", f"{state}\n{logs}\n{cluster.logs()}"
    assert "got SIGUSR1, forwarding to the ranks" in logs and "requeueing job" in logs, logs
    assert "resuming from" in logs, logs
    reasons = [ckpt.read_meta(f)["reason"] for f in ckpt.listing(ckpt.checkpoint_dir(run_dir))]
    assert "stop" in reasons and reasons[-1] == "end", (reasons, logs)
    assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 30


def test_documented_try_out_fits_a_16_cpu_node_and_test_only_says_why_not(cluster):
    """The try-out line of docs/slurm.md gets a start time on the 16-CPU node; without its
    --cpus-per-task=1 (the line the docs gave before) the request is 4 x 8 CPUs, which pends for ever,
    and `sbatch --test-only` says why, as the docs promise."""
    env, options, script = documented_try_out()
    assert script == "slurm/gossip_64.sh" and env == {"CONFIG": "jobs/digits-gossip.toml"}, (env, script)
    assert (ROOT / env["CONFIG"]).exists()
    ok = cluster.run(["sbatch", "--test-only", *options, script], cwd=ROOT)
    assert ok.returncode == 0 and "to start at" in ok.stderr, ok.stderr
    old = [o for o in options if not o.startswith(("--cpus-per-task", "--time"))]
    bad = cluster.run(["sbatch", "--test-only", *old, script], cwd=ROOT)
    assert bad.returncode != 0, bad
    assert "Requested node configuration is not available" in bad.stderr + bad.stdout, bad


def test_run_sh_checks_before_launching_and_cleans_dev_shm_after_a_failed_step(cluster, tmp_path):
    """Four jobs at once, with the try-out's options: no venv, the default job file's placeholder
    data, a time limit within the warning lead (each: one line, FAILED, no srun), and a short but
    workable limit (a warning) whose step fails on an injected fault, after which run.sh removes this
    user's unused MPI segments from /dev/shm (a planted one stands for those of a killed job)."""
    (tmp_path / "tiny.toml").write_text(TINY_JOB.replace("epochs = 1", "epochs = 20"))
    data = make_dataset(tmp_path / "data", n=96, n_val=24, num_classes=4)
    _, options, _ = documented_try_out()
    base = dict(VENV=sys.prefix, SCALESGD_PMI="pmi2", RUNS=str(tmp_path / "runs"), OMP_NUM_THREADS="1")
    tiny = dict(base, CONFIG=str(tmp_path / "tiny.toml"), DATA=str(data))
    planted = Path("/dev/shm") / f"mpich_shm_scalesgdtest{uuid.uuid4().hex[:8]}_0"
    planted.write_bytes(b"\0" * mmap.PAGESIZE)
    cases = {"venv": (options, dict(tiny, VENV=str(tmp_path / "no-venv"))),
             "data": (options, base),
             "time": ([*options, "--time=6"], tiny),
             "fault": ([*options, "--time=8"], dict(tiny, SCALESGD_INJECT_FAULT="1:2"))}
    try:
        jobs = {name: submit(cluster, opts, tmp_path / name, **env) for name, (opts, env) in cases.items()}
        states = {name: wait_for_job(cluster, job, timeout=120) for name, job in jobs.items()}
        logs = {name: "\n".join(f.read_text(errors="replace") for f in (tmp_path / name).glob("*.out"))
                for name in jobs}
    finally:
        still_there = planted.exists()
        planted.unlink(missing_ok=True)
    needles = {"venv": f"no Python at {tmp_path}/no-venv/bin/python",
               "data": "/data/imagenet-shards/manifest.json: manifest not found (checked before launching",
               "time": "s left, but the warning signal comes 300 s before the end (--signal=B:USR1@300)"}
    for name, needle in needles.items():
        errors = [ln for ln in logs[name].splitlines() if ln.startswith("scalesgd: error")]
        assert states[name] == "FAILED", (name, states[name], logs[name])
        assert len(errors) == 1 and needle in errors[0], (name, logs[name])
        assert "+ srun" not in logs[name] and "Traceback" not in logs[name], logs[name]
    fault = logs["fault"]
    assert states["fault"] == "FAILED", fault
    assert "scalesgd: warning: time limit: " in fault and "injected fault" in fault, fault
    assert re.search(r"removed \d+ stale MPI segment", fault) and str(planted) in fault, fault
    assert not still_there, fault


def test_run_sh_checks_also_run_outside_slurm(tmp_path):
    """The same checks when a script is run by hand with bash (no Slurm needed): one line each,
    nothing launched, nothing written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    runs = tmp_path / "runs"
    for extra, needle, code in ((dict(VENV=str(tmp_path / "none")), "no Python at", 1),
                                (dict(VENV=sys.prefix), "manifest not found (checked before launching", 1),
                                (dict(VENV=sys.prefix, EXTRA_ARGS="--lr abc"), "lr", 2)):
        p = subprocess.run(["bash", "slurm/gossip_64.sh"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env=dict(env, RUNS=str(runs), **extra))
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith("scalesgd: error")]
        assert p.returncode == code, (extra, p.returncode, p.stderr)
        assert len(errors) == 1 and needle in errors[0], (extra, p.stderr)
        assert "+ srun" not in p.stdout and not runs.exists(), p.stdout


def test_run_sh_starts_again_when_requeued_before_the_first_checkpoint(tmp_path):
    """A job that Slurm requeues before its first checkpoint (a node lost soon after the start) finds
    its RUN_DIR holding the earlier attempt's config.json and nothing to resume from.  Run by hand
    with bash and mpiexec, SLURM_RESTART_COUNT set as a requeue sets it, RUN_DIR given with a
    trailing slash and a glob character in its name: the first attempt dies on an injected fault
    before any checkpoint; a fresh job (no restart count) finding that RUN_DIR is still refused and
    touches nothing, and so is a requeued job when the run there is another job's (its slurm-job
    mark); the requeued attempt of the job that started it keeps the earlier attempt beside, as
    RUN_DIR.restart-1, and trains to the end."""
    from mpirun import mpiexec
    if mpiexec() is None:
        pytest.skip("no mpiexec")
    (tmp_path / "tiny.toml").write_text(TINY_JOB)
    data = make_dataset(tmp_path / "data", n=96, n_val=24, num_classes=4)
    run_dir = tmp_path / "runs" / "job[1]"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(VENV=sys.prefix, CONFIG=str(tmp_path / "tiny.toml"), DATA=str(data), RUN_DIR=f"{run_dir}/",
               SCALESGD_LAUNCHER="mpirun", MPIEXEC=mpiexec(), SLURM_NTASKS="2", OMP_NUM_THREADS="1")

    def attempt(**extra):
        return subprocess.run(["bash", "slurm/gossip_64.sh"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env=dict(env, **extra))

    def listing(d):
        return sorted(p.relative_to(d) for p in d.rglob("*"))

    # any rank, after its first step (gossip shares an epoch's samples out: a rank slow to start may
    # do no second step, and then "1:2" never fired)
    first = attempt(SCALESGD_INJECT_FAULT="*:1")
    assert first.returncode != 0 and "injected fault" in first.stderr, (first.stdout, first.stderr)
    assert (run_dir / "config.json").exists() and not list(run_dir.glob("checkpoints/*.h5"))
    assert (run_dir / "slurm-job").read_text() == "local\n"          # (no SLURM_JOB_ID: run by hand)
    before = listing(run_dir)

    for extra in ({}, {"SLURM_RESTART_COUNT": "1", "SLURM_JOB_ID": "12345"}):   # not a requeue; not its run
        refused = attempt(**extra)
        assert refused.returncode == 2 and f"--run-dir {run_dir} already holds a run" in refused.stderr, \
            (extra, refused.stderr)
        assert listing(run_dir) == before and not list(run_dir.parent.glob("job*.restart-*")), extra

    requeued = attempt(SLURM_RESTART_COUNT="1")
    assert requeued.returncode == 0, (requeued.stdout, requeued.stderr)
    aside = run_dir.parent / "job[1].restart-1"
    assert f"the earlier attempt is kept in {aside}" in requeued.stdout, requeued.stdout
    assert listing(aside) == before
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["method"] == "gossip" and summary["ranks"] == 2 and summary["epochs"] == 1
