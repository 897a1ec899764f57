"""Checkpoints: file format and atomicity, exact resume, preemption by signal, warm start, faults.
Real processes, real mpiexec, real HDF5 files."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import (ROOT, TINY, ended, final_arrays, launch, one_line_error, rank_pid, rank_pids, ranks_left,
                     run_cli, start, stop)
from mpirun import uses_mpi
from synth import make_dataset

from scalesgd.io import checkpoint as ckpt

MPI = uses_mpi                                   # marked mpi, skipped without mpiexec


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ck"), n=48, n_val=16, num_classes=4)


# ----------------------------------------------------------------------------- the file itself
def write(directory, g, ranks=2, value=1.0):
    w = ckpt.Writer(directory, g, {"ranks": ranks, "method": "single"})
    for r in range(ranks):
        w.add_rank(r, {"params": np.full(1000, value + r)}, json.dumps({"r": r}))
    return w.commit()


def test_writer_reader_digests_and_pruning(tmp_path):
    paths = [write(tmp_path, g, value=g) for g in (10, 20, 30, 40)]
    assert [p.name for p in ckpt.listing(tmp_path)] == [p.name for p in paths]
    meta, arrays, state = ckpt.read_rank(paths[1], 1)
    assert meta["ranks"] == 2 and state == {"r": 1} and np.all(arrays["params"] == 21.0)
    ckpt.prune(tmp_path, 2)
    assert [p.name for p in ckpt.listing(tmp_path)] == [paths[2].name, paths[3].name]
    with h5py.File(paths[3], "r+") as f:            # flip data: the digest must catch it
        f["rank-00001/params"][5] = -1.0
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch in /rank-00001/params"):
        ckpt.verify(paths[3])
    with pytest.raises(ckpt.CheckpointError, match=f"previous good checkpoint is {paths[2]}"):
        ckpt.latest_good(tmp_path)
    paths[3].write_bytes(paths[3].read_bytes()[:2000])   # truncated
    with pytest.raises(ckpt.CheckpointError, match="truncated or corrupt"):
        ckpt.verify(paths[3])


KILL_DURING_WRITE = """
import sys, json, numpy as np
sys.path.insert(0, {src!r})
from pathlib import Path
from scalesgd.io import checkpoint as ckpt
d = Path({d!r})
w = ckpt.Writer(d, 1, {{"ranks": 1, "method": "single"}})
w.add_rank(0, {{"params": np.ones(10)}}, "{{}}")
w.commit()
w = ckpt.Writer(d, 2, {{"ranks": 1, "method": "single"}})
print("writing", flush=True)
while True:                                   # killed in here, mid-write
    w.add_rank(len(w.f), {{"params": np.random.rand(2_000_000)}}, "{{}}")
"""


def test_kill_during_a_write_leaves_the_previous_checkpoint(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", KILL_DURING_WRITE.format(src=str(ROOT / "src"),
                                                                          d=str(tmp_path))],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    time.sleep(0.5)
    p.kill()
    p.wait(timeout=10)
    good = ckpt.latest_good(tmp_path)
    assert good.name == ckpt.file_name(1)
    assert ckpt.verify(good)["ranks"] == 1


# ----------------------------------------------------------------------------- exact resume
@pytest.mark.parametrize("method,ranks", [("single", 1)])
def test_interrupted_and_resumed_run_is_bitwise_identical(tmp_path, data, method, ranks):
    """Run A: 2 epochs, a checkpoint every half epoch.  Run B: A's directory cut back to the
    mid-epoch checkpoint of epoch 0, resumed.  Same final params, momentum, BN statistics, and the
    same validation history.  (Every MPI method, and more ways to resume: test_resume.py.)"""
    args = ["--data", str(data), "--method", method, *TINY, "--epochs", "2", "--batch-size", "4",
            "--checkpoint-every", "0.5", "--keep-checkpoints", "10", "--augment", "multiscale"]
    a = tmp_path / "a"
    p = run_cli([*args, "--run-dir", str(a)], tmp_path, launcher=launch(ranks))
    assert p.returncode == 0, p.stderr
    files = ckpt.listing(ckpt.checkpoint_dir(a))
    assert len(files) == 4
    b = tmp_path / "b"
    shutil.copytree(a, b)
    for f in ckpt.listing(ckpt.checkpoint_dir(b))[1:]:
        f.unlink()
    (b / "summary.json").unlink()
    p = run_cli(["--resume", str(b)], tmp_path, launcher=launch(ranks))
    assert p.returncode == 0, p.stderr
    fa, fb = final_arrays(a), final_arrays(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
    ha = json.loads((a / "summary.json").read_text())["history"]
    hb = json.loads((b / "summary.json").read_text())["history"]
    key = lambda h: [(r["global_samples"], r["val_top1_accuracy"]) for r in h]  # noqa: E731
    assert key(ha) == key(hb)


# ----------------------------------------------------------------------------- preemption
def steps_logged(run_dir: Path, rank: int = 0) -> int:
    f = run_dir / "metrics" / f"rank-{rank}.jsonl"
    return f.read_text().count('"kind": "step"') if f.exists() else 0


def wait_until(cond, what: str, timeout: float = 60) -> None:
    """Polls ``cond()`` until it holds; a guard against a run that never gets there, not a bound
    on its speed."""
    t = time.monotonic()
    while not cond():
        assert time.monotonic() - t < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def wait_for_steps(run_dir: Path, n: int, rank: int = 0) -> None:
    wait_until(lambda: steps_logged(run_dir, rank) >= n, f"{n} steps logged by rank {rank}")


@MPI
@pytest.mark.parametrize("method,ranks,sig,victim", [("allreduce", 2, signal.SIGUSR1, -1),
                                                     ("easgd", 3, signal.SIGTERM, -1),
                                                     ("gossip", 3, signal.SIGUSR1, -1),
                                                     ("localsgd", 2, signal.SIGTERM, -1),
                                                     ("easgd-shards", 4, signal.SIGTERM, 1)])
def test_signal_to_one_rank_checkpoints_everyone_and_resumes(tmp_path, data, method, ranks, sig, victim):
    """The signal goes to the last rank (a worker), or with two server shards to shard 1, whose
    stop only its replies carry (server 0 decides the phases); local SGD's travels with its next
    exchange (every 5 steps)."""
    run_dir = tmp_path / "run"
    method, _, shards = method.partition("-")
    args = ["--data", str(data), "--method", method, *TINY, "--epochs", "40", "--batch-size", "4",
            "--run-dir", str(run_dir), "--straggler", "0:20"]
    if method == "gossip":
        args += ["--gossip", "push"]
    if method == "localsgd":
        args += ["--tau", "5"]
    if shards:             # one evaluation, at the end: no phase but the stop's can end the run early
        args += ["--servers", "2", "--eval-every", "40"]
    p = start(args, ranks)
    try:
        wait_for_steps(run_dir, 8, rank=ranks - 1 if method == "easgd" else 0)   # easgd: servers first
        os.kill(rank_pid(str(run_dir), ranks - 1 if victim < 0 else victim), sig)   # not the launcher
        out, err = ended(p, 60, f"{method}: a signal to one rank did not stop the job")
    finally:
        stop(p)
    assert p.returncode == 75, f"rc={p.returncode}\n{out}\n{err}"
    assert "stopped on a signal; checkpoint written" in err
    last = ckpt.listing(ckpt.checkpoint_dir(run_dir))[-1]
    meta = ckpt.verify(last)
    assert meta["reason"] == "stop" and meta["ranks"] == ranks
    assert not (run_dir / "summary.json").exists()
    p = run_cli(["--resume", str(run_dir), "--epochs", "8"], tmp_path, launcher=launch(ranks))
    assert p.returncode == 0, p.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["method"] == method and s["history"][-1]["global_samples"] == s["samples"]


@MPI
def test_sigkill_of_one_rank_ends_the_job_and_the_last_checkpoint_resumes(tmp_path, data):
    run_dir = tmp_path / "run"
    args = ["--data", str(data), "--method", "gossip", *TINY, "--epochs", "40", "--batch-size", "4",
            "--run-dir", str(run_dir), "--checkpoint-every", "1", "--straggler", "0:20"]
    p = start(args, 3)
    try:
        wait_for_steps(run_dir, 30)
        wait_until(lambda: ckpt.listing(ckpt.checkpoint_dir(run_dir)), "a first checkpoint")
        ranks = rank_pids(str(run_dir))
        assert len(ranks) == 3, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        # the survivors block at the next collective; only the launcher can end them
        ended(p, 30, "after one rank was SIGKILLed the launcher did not end the other two")
    finally:
        stop(p)
    assert p.returncode != 0
    assert ranks_left(str(run_dir)) == [], "a rank outlived the job"
    assert not (run_dir / "summary.json").exists()    # ended by the kill, not by finishing 40 epochs
    p = run_cli(["--resume", str(run_dir), "--epochs", "2"], tmp_path, launcher=launch(3))
    assert p.returncode == 0, p.stderr


# ----------------------------------------------------------------------------- warm start, faults
@MPI
def test_warm_start_from_a_single_rank_model(tmp_path, data):
    single = tmp_path / "single"
    p = run_cli(["--data", str(data), *TINY, "--epochs", "6", "--run-dir", str(single)], tmp_path)
    assert p.returncode == 0, p.stderr
    source = ckpt.listing(ckpt.checkpoint_dir(single))[-1]
    runs = {}
    for name, extra in (("cold", []), ("warm", ["--init-from", str(source)])):
        runs[name] = tmp_path / name
        p = run_cli(["--data", str(data), "--method", "easgd", *TINY, "--run-dir", str(runs[name]),
                     *extra], tmp_path, launcher=launch(3))
        assert p.returncode == 0, p.stderr
    first = {k: json.loads((d / "metrics" / "rank-1.jsonl").read_text().splitlines()[0])["loss"]
             for k, d in runs.items()}
    assert first["warm"] < first["cold"], first         # it starts from the trained weights


def test_resume_refuses_a_different_method_or_model(tmp_path, data):
    run_dir = tmp_path / "run"
    assert run_cli(["--data", str(data), *TINY, "--run-dir", str(run_dir)], tmp_path).returncode == 0
    p = run_cli(["--resume", str(run_dir), "--width", "0.5"], tmp_path)
    one_line_error(p, f"cannot resume {run_dir}", "model.width was 0.25, now 0.5")
    p = run_cli(["--resume", str(run_dir), "--method", "allreduce"], tmp_path)
    one_line_error(p, "train.method was 'single', now 'allreduce'")
    p = run_cli(["--resume", str(run_dir), "--gossip-graph", "ring"], tmp_path)   # a peer choice's state
    one_line_error(p, "dist.gossip_graph was 'uniform', now 'ring'")
    p = run_cli(["--init-from", str(ckpt.listing(ckpt.checkpoint_dir(run_dir))[-1]), "--data", str(data),
                 *TINY, "--width", "0.5", "--run-dir", str(tmp_path / "w")], tmp_path)
    one_line_error(p, "is not this run's")


@MPI
def test_resume_with_another_rank_count_or_a_corrupt_checkpoint_is_refused(tmp_path, data):
    run_dir = tmp_path / "run"
    args = ["--data", str(data), "--method", "localsgd", *TINY, "--epochs", "2",
            "--checkpoint-every", "1", "--run-dir", str(run_dir)]   # (the methods resume on any p:
    assert run_cli(args, tmp_path, launcher=launch(2)).returncode == 0      # not another method)
    p = run_cli(["--resume", str(run_dir), "--method", "allreduce"], tmp_path, launcher=launch(3))
    one_line_error(p, "cannot resume", "train.method was 'localsgd', now 'allreduce'")
    first, last = ckpt.listing(ckpt.checkpoint_dir(run_dir))
    last.write_bytes(last.read_bytes()[:4096])
    p = run_cli(["--resume", str(run_dir)], tmp_path, launcher=launch(2))
    one_line_error(p, str(last), f"the previous good checkpoint is {first}")


@MPI
@pytest.mark.parametrize("method,ranks,rank", [("allreduce", 2, 1), ("easgd", 3, 2), ("asgd", 3, 1),
                                               ("gossip", 3, 2)])
def test_one_ranks_error_ends_every_method_fast(tmp_path, data, method, ranks, rank):
    """An exception on one rank mid-training (injected) ends the whole job with that rank's
    message: the others, blocked in an all-reduce, a server exchange or nothing at all (gossip),
    are ended by MPI_Abort, never left hanging."""
    run_dir = tmp_path / "run"
    p = start(["--data", str(data), "--method", method, *TINY, "--epochs", "20", "--batch-size", "4",
               "--run-dir", str(run_dir)], ranks, env={"SCALESGD_INJECT_FAULT": f"{rank}:3"})
    try:
        _, err = ended(p, 60, f"{method}: rank {rank}'s error did not end the job")
    finally:
        stop(p)
    assert p.returncode != 0
    errors = [ln for ln in err.splitlines() if ln.startswith("scalesgd: error")]
    # an unexpected exception also shows its traceback; the one error line names rank and cause
    assert len(errors) == 1 and f"(rank {rank}/{ranks})" in errors[0], err
    assert "injected fault" in errors[0]
    # the others were ended, not left blocked or training on: no rank outlives the job
    assert ranks_left(str(run_dir)) == [], "a rank outlived the job"
    assert not (run_dir / "summary.json").exists()


@pytest.fixture
def small_filesystem(tmp_path):
    """A 400 KiB tmpfs (root and mount(8) needed, else skipped with the reason; CI runs as root):
    room for the run's files and one checkpoint of the tiny model, not for two."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a small file system")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_loses_nothing(tmp_path, small_filesystem):
    """Issue 26: the disk filling up while a checkpoint is written printed a 62-line traceback (HDF5
    raised again when the unfinished file was closed).  Now: one line naming the checkpoint, the
    cause, the file system and the last good checkpoint; no temporary file left; that checkpoint
    still verifies."""
    run_dir = small_filesystem / "run"
    p = run_cli([*TINY, "--epochs", "3", "--checkpoint-every", "1", "--keep-checkpoints", "3",
                 "--run-dir", str(run_dir)], tmp_path)
    ckpts = run_dir / "checkpoints"
    good = ckpt.listing(ckpts)
    assert len(good) == 1, (p.stderr, good)
    line = one_line_error(p, "cannot write the checkpoint (No space left on device)",
                          f"on the file system mounted at {small_filesystem}",
                          f"the last good checkpoint is {good[0]}")
    assert line.startswith(f"scalesgd: error: {ckpts}/ckpt-"), line
    assert sorted(f.name for f in ckpts.iterdir()) == [good[0].name], "a temporary file was left"
    ckpt.verify(good[0])
