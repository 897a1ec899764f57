"""Resume, for every method, in the three ways users do it (real checkpoints; real mpiexec for one
method per protocol: all-reduce's collectives, the server ports with two shards, push-sum's
one-sided inboxes; the others in the virtual cluster, the same code in one process):

- **partial**: a finished run cut back to its first checkpoint, resumed;
- **extend**: a finished 2-epoch run resumed with ``--epochs 3``;
- **killed**: a run whose worker is SIGKILLed mid-run, resumed from its last periodic checkpoint.

Each must finish (never hang), evaluate every boundary exactly once, and write no extra checkpoint
on resuming.  Where the method is deterministic (allreduce) the parameters and the validation
history equal those of an uninterrupted run, bit for bit.  Plus: a stop request always ends the
job, even a deadlocked one (the stop deadline).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpirun import needs_mpi
from synth import make_dataset
from helpers import ROOT, TINY, final_arrays, launch, rank_pids, run_cli

from scalesgd.backend import blas_threads_for
from scalesgd.io import checkpoint as ckpt
from scalesgd.virtual import run as VR

pytestmark = [needs_mpi, pytest.mark.mpi]

METHODS = {"allreduce": [], "easgd": [], "asgd": [], "gossip-pull": ["--gossip", "pull"],
           "gossip-push": ["--gossip", "push", "--gossip-overlap"],   # pushes in flight at a checkpoint
           "easgd-sharded": ["--servers", "2"]}          # two server shards, one worker
DETERMINISTIC = ("allreduce", "easgd-sharded")          # (one worker: no arrival order)
VIRTUAL = ("easgd", "asgd", "gossip-pull")              # MPI is not what they add: in one process
RANKS = 3                    # server methods: a server and two workers


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("resume"), n=48, n_val=16, num_classes=4)


def args_for(name, data, run_dir, epochs=2):
    method = name.split("-")[0]
    return ["--data", str(data), "--method", method, *METHODS[name], *TINY, "--batch-size", "4",
            "--epochs", str(epochs), "--checkpoint-every", "0.5", "--keep-checkpoints", "10",
            "--run-dir", str(run_dir), "--progress", "off",
            "--cosine-epochs", "3"]     # the same learning rates for 2 epochs extended to 3 as for 3


def ok(p):
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr}"


def history(run_dir: Path) -> list[tuple[int, float]]:
    h = json.loads((run_dir / "summary.json").read_text())["history"]
    return [(r["global_samples"], r["val_top1_accuracy"]) for r in h]


def boundaries(run_dir: Path) -> list[int]:
    return [g for g, _ in history(run_dir)]


def checkpoints(run_dir: Path) -> list[Path]:
    return ckpt.listing(ckpt.checkpoint_dir(run_dir))


def resume(run_dir, tmp_path, *extra, virtual=False):
    p = (run_virtual if virtual else run_cli)(["--resume", str(run_dir), *extra], tmp_path, timeout=120,
                                             launcher=launch(RANKS))
    ok(p)
    return p


def run_virtual(args, tmp_path, timeout=120, launcher=(), faults=""):
    """The virtual cluster's ARGS with RANKS ranks (``--workers``: the ranks less the servers), one
    BLAS thread: in this process (its ``main``, the same code as ``python -m scalesgd.virtual``
    without a new process's start-up, most of a tiny run's cost), or, with ``faults``
    (SCALESGD_INJECT_FAULT: a worker dies, and the process with it), as that command from the
    repository root.  Returns the (Completed)Process."""
    servers = 0 if "--resume" in args else 2 if "--servers" in args else int(
        any(m in args for m in ("easgd", "asgd")))
    workers = [] if "--resume" in args else ["--workers", str(RANKS - servers)]
    if faults:
        return run_cli([*args, *workers], tmp_path, timeout, module="scalesgd.virtual",
                       env={"SCALESGD_INJECT_FAULT": faults})
    rc = VR.main([*args, *workers, "--threads", "1"])
    return subprocess.CompletedProcess(args, rc, "", "(in the test's process: its log is the test's output)")


def assert_same_state(a: Path, b: Path):
    fa, fb = final_arrays(a), final_arrays(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
    assert history(a) == history(b)


@pytest.mark.parametrize("name", list(METHODS))
def test_resume_partial_extended_and_killed_runs(tmp_path, data, name):
    deterministic, virtual = name in DETERMINISTIC, name in VIRTUAL
    start = run_virtual if virtual else run_cli
    a = tmp_path / "a"
    ok(start(args_for(name, data, a), tmp_path, launcher=launch(RANKS)))
    assert boundaries(a) == [48, 96] and len(checkpoints(a)) == 4

    # partial: cut back to the first checkpoint (half an epoch), resume
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for f in checkpoints(b)[1:]:
        f.unlink()
    (b / "summary.json").unlink()
    resume(b, tmp_path, virtual=virtual)
    assert boundaries(b) == [48, 96]                  # each boundary evaluated once
    assert len(checkpoints(b)) == 4                   # no extra checkpoint after resuming
    first = ckpt.read_meta(checkpoints(b)[0])
    assert first["boundary_done"] == 24 and first["reason"] == "scheduled"
    if deterministic:
        assert_same_state(a, b)

    # extend: the finished run continued to 3 epochs
    c = tmp_path / "c"
    shutil.copytree(a, c)
    resume(c, tmp_path, "--epochs", "3", virtual=virtual)
    assert boundaries(c) == [48, 96, 144]
    assert len(checkpoints(c)) == 6
    assert ckpt.read_meta(checkpoints(a)[-1])["boundary_done"] == 96
    if deterministic:
        d = tmp_path / "d"
        ok(start(args_for(name, data, d, epochs=3), tmp_path, launcher=launch(RANKS)))
        assert_same_state(d, c)

    # killed: a 3-epoch run whose last rank, a worker, is SIGKILLed once its first checkpoint exists
    # (virtual: dies after its step 7, past the checkpoints at steps 2 and 4 or 3 and 6), then
    # resumed from its last good checkpoint
    e = tmp_path / "e"
    if virtual:
        p = run_virtual(args_for(name, data, e, epochs=3), tmp_path, faults=f"{RANKS - 1}:7:kill")
        err = p.stderr
    else:
        err, p = killed_mpi_run(name, data, e)
    assert p.returncode != 0 and not (e / "summary.json").exists(), err
    assert checkpoints(e), err
    resume(e, tmp_path, virtual=virtual)
    assert boundaries(e) == [48, 96, 144]
    if deterministic:
        assert_same_state(d, e)


def killed_mpi_run(name, data, e):
    """A 3-epoch MPI run slowed down (a 100 ms sleep per step: the same numbers) whose last rank is
    SIGKILLed once its first checkpoint exists: (stderr, the launcher's process)."""
    p = subprocess.Popen([*launch(RANKS), sys.executable, "-m", "src.main",
                          *args_for(name, data, e, epochs=3), "--straggler", "0,1,2:100"],
                         cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not checkpoints(e):
            assert time.monotonic() < deadline and p.poll() is None, "no checkpoint"
            time.sleep(0.01)
        os.kill(rank_pids(str(e))[-1], signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return err, p


def test_a_stop_ends_a_deadlocked_job_naming_where_it_hung(tmp_path, data):
    """Rank 2 blocks for ever in an MPI receive (a deadlock); SIGTERM to the launcher then cannot
    checkpoint through the stuck collectives, so after --stop-timeout the job exits non-zero, the
    ranks saying what they were doing (before the deadline existed it ran until killed)."""
    env = dict(os.environ, SCALESGD_INJECT_FAULT="2:3:hang", OMP_NUM_THREADS="1")
    run_dir = tmp_path / "run"
    p = subprocess.Popen([*launch(RANKS), sys.executable, "-m", "src.main",
                          *args_for("easgd", data, run_dir, epochs=100), "--stop-timeout", "3"],
                         cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        metrics = run_dir / "metrics" / "rank-2.jsonl"
        while not (metrics.exists() and metrics.read_text().count('"kind": "step"') >= 3):
            assert time.monotonic() < deadline and p.poll() is None, "rank 2 never reached step 3"
            time.sleep(0.1)
        time.sleep(1.0)                                 # the others are now blocked on rank 2
        t = time.monotonic()
        for pid in rank_pids(str(run_dir)):             # SIGTERM to every rank, as Slurm sends it
            os.kill(pid, signal.SIGTERM)                # (launchers differ in forwarding it)
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        p.kill()
    assert p.returncode not in (0, 75), err
    assert took < 30, took
    lines = [ln for ln in err.splitlines() if ln.startswith("scalesgd: error")]
    # every rank's deadline expires at about the same time; the first MPI_Abort ends the others,
    # so which ranks get to say what they were doing varies: at least one does
    assert lines and all("train.stop_timeout" in ln and "but this rank is still" in ln
                         for ln in lines), err


def test_the_summary_names_the_blas_threads_only_when_every_allocation_agreed():
    from scalesgd.train.rankstate import LoopState
    st = LoopState()
    st.add_blas_threads((2, 2))
    assert st.blas_summary() == {"blas_threads": 2}
    st = LoopState.from_dict(json.loads(json.dumps(st.to_dict())))     # a resume
    st.add_blas_threads((1, 2))
    assert st.blas_summary() == {"blas_threads": None, "blas_threads_range": [1, 2]}
    older = LoopState.from_dict({"step": 3})                           # a checkpoint without them
    older.add_blas_threads((2, 2))
    assert older.blas_summary() == {"blas_threads": None}
    assert LoopState().blas_summary() == {}                            # not recorded (virtual)


def test_allreduce_resumes_on_fewer_and_more_ranks(tmp_path, data):
    """Issue 26, item 2: a 4-rank all-reduce run resumes on 2 ranks and then on 6 and trains on; the
    data position continues from the global sample count, every boundary is evaluated once, and
    the history shows the change of p.  A checkpoint of another method is refused, naming both."""
    run_dir = tmp_path / "ar"
    base = ["--data", str(data), "--method", "allreduce", *TINY, "--batch-size", "4",
            "--checkpoint-every", "0.5", "--keep-checkpoints", "10", "--progress", "off"]
    ok(run_cli([*base, "--epochs", "1", "--run-dir", str(run_dir)], tmp_path, timeout=120,
               launcher=launch(4)))
    for ranks, epochs in ((2, 2), (6, 3)):
        p = run_cli(["--resume", str(run_dir), "--epochs", str(epochs)], tmp_path, timeout=180,
                    launcher=launch(ranks))
        ok(p)
        assert "not bitwise: the data order depends on the rank count" in p.stderr, p.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["ranks"], s["allocations"]) == (6, 3)
    threads = {blas_threads_for(p, env={"OMP_NUM_THREADS": "1"}) for p in (4, 2, 6)}   # (run_cli's cap)
    if len(threads) == 1:                   # every allocation's BLAS threads: what a replay needs
        assert s["blas_threads"] == threads.pop(), s
    else:
        assert s["blas_threads"] is None and s["blas_threads_range"] == [min(threads), max(threads)], s
    workers = [h["workers"] for h in s["history"]]
    assert workers[0] == 4 and 2 in workers and workers[-1] == 6, workers
    gs = [h["global_samples"] for h in s["history"]]
    assert gs == sorted(set(gs)) and s["history"][-1]["epoch"] == 3.0, gs
    meta = ckpt.read_meta(checkpoints(run_dir)[-1])
    assert (meta["ranks"], meta["reason"]) == (6, "end")
    # a checkpoint of another method: refused, naming both (a real file)
    from scalesgd.errors import CheckpointError
    from scalesgd.train import resuming
    w = ckpt.Writer(tmp_path / "e" / "checkpoints", 96, {"ranks": 2, "method": "localsgd"})
    for r in range(2):
        w.add_rank(r, {"params": np.zeros(3, np.float32)}, "{}")
    path = w.commit()
    assert resuming.find_checkpoint(str(path), 3, "localsgd") == path          # any rank count
    with pytest.raises(CheckpointError, match="written by 2 ranks of 'localsgd', this job has 2 ranks of "
                                              "'single'"):
        resuming.find_checkpoint(str(path), 2, "single")


@pytest.mark.parametrize("name,flags", [
    ("push-sum", ["--method", "gossip", "--gossip", "push", "--gossip-overlap"]),
    ("localsgd", ["--method", "localsgd", "--tau", "3"])])
def test_averaging_methods_resume_on_fewer_ranks_from_the_saved_average(tmp_path, data, name, flags):
    """Issue 26, item 2 (gossip, local SGD): a 3-rank run resumed on 2 ranks starts every new rank
    from the saved replicas' average (push-sum: sum(w_i x_i) / sum(w_i), weight 1 again).  Resumed
    with lr 0, nothing moves the replicas away from that point (mixing or averaging equal replicas
    keeps them), so the final checkpoint's replicas equal the average computed from the saved ones."""
    run_dir = tmp_path / "ps"
    base = ["--data", str(data), *flags, *TINY, "--batch-size", "4", "--progress", "off",
            "--run-dir", str(run_dir)]
    ok(run_cli([*base, "--epochs", "1"], tmp_path, timeout=120, launcher=launch(3)))
    saved = final_arrays(run_dir)
    meta_path = checkpoints(run_dir)[-1]
    weights = [ckpt.read_rank(meta_path, r)[2]["method"].get("weight", 1.0) for r in range(3)]
    assert abs(sum(weights) - 3) < 1e-9
    if name == "push-sum":
        assert len(set(weights)) > 1, weights                                   # unequal: a real test
    else:                                                     # the replicas differ at the checkpoint
        assert not np.array_equal(saved["rank-00000/params"], saved["rank-00001/params"])
    want = sum(w * saved[f"rank-{r:05d}/params"].astype(np.float64) for r, w in enumerate(weights)) / 3
    ok(run_cli(["--resume", str(run_dir), "--epochs", "2", "--lr", "0"], tmp_path, timeout=120,
               launcher=launch(2)))
    got = final_arrays(run_dir)
    assert ckpt.read_meta(checkpoints(run_dir)[-1])["ranks"] == 2
    for r in range(2):
        np.testing.assert_allclose(got[f"rank-{r:05d}/params"], want, rtol=1e-5, atol=1e-6)
    workers = [h["workers"] for h in json.loads((run_dir / "summary.json").read_text())["history"]]
    assert workers[0] == 3 and workers[-1] == 2, workers


def test_asgd_resumes_on_more_workers_from_the_master(tmp_path, data):
    """Issue 26, item 2 (server methods): a 3-rank A-SGD run (a server, two workers) resumed on 4
    ranks: the server keeps its master weights and counters, each worker (the new one included)
    starts from the master.  Resumed at lr 0 the workers push zero updates, so every replica and
    the master in the final checkpoint equal the saved master."""
    run_dir = tmp_path / "asgd"
    ok(run_cli(["--data", str(data), "--method", "asgd", *TINY, "--batch-size", "4", "--epochs", "1",
                "--progress", "off", "--run-dir", str(run_dir)], tmp_path, timeout=120, launcher=launch(3)))
    master = final_arrays(run_dir)["rank-00000/params"]
    ok(run_cli(["--resume", str(run_dir), "--epochs", "2", "--lr", "0"], tmp_path, timeout=120,
               launcher=launch(4)))
    got = final_arrays(run_dir)
    assert ckpt.read_meta(checkpoints(run_dir)[-1])["ranks"] == 4
    for r in range(4):
        np.testing.assert_array_equal(got[f"rank-{r:05d}/params"], master, err_msg=f"rank {r}")
    workers = [h["workers"] for h in json.loads((run_dir / "summary.json").read_text())["history"]]
    assert workers[0] == 2 and workers[-1] == 3, workers
