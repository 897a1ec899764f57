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

from mpirun import mpi_launcher, uses_mpi
from synth import make_dataset
from test_cli import ROOT, TINY, one_line_error, run_cli

from scalesgd.io import checkpoint as ckpt

MPI = uses_mpi                                   # marked mpi, skipped without mpiexec


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ck"), n=48, n_val=16, num_classes=4)


def launch(n):
    return () if n == 1 else tuple(mpi_launcher(n))


def final_arrays(run_dir: Path) -> dict:
    """Every dataset of the newest checkpoint, by 'rank-K/name'."""
    path = ckpt.listing(ckpt.checkpoint_dir(run_dir))[-1]
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset)
                     else None)
    return out


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
def rank_pids(tag: str) -> list[int]:
    """PIDs of the Python ranks whose command line contains ``tag``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"python") and any(tag.encode() in c for c in cmd):
                out.append(int(d.name))
    return out


def wait_for_steps(run_dir: Path, n: int, timeout: float = 60, rank: int = 0):
    t = time.monotonic()
    f = run_dir / "metrics" / f"rank-{rank}.jsonl"
    while time.monotonic() - t < timeout:
        if f.exists() and f.read_text().count('"kind": "step"') >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} steps in {f} within {timeout}s")


def start(args, tmp_path, ranks):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([*launch(ranks), sys.executable, "-m", "src.main", *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@MPI
@pytest.mark.parametrize("method,ranks,sig", [("allreduce", 2, signal.SIGUSR1),
                                              ("easgd", 3, signal.SIGTERM),
                                              ("gossip", 3, signal.SIGUSR1)])
def test_signal_to_one_rank_checkpoints_everyone_and_resumes(tmp_path, data, method, ranks, sig):
    run_dir = tmp_path / "run"
    args = ["--data", str(data), "--method", method, *TINY, "--epochs", "40", "--batch-size", "4",
            "--run-dir", str(run_dir), "--straggler", "0:20"]
    if method == "gossip":
        args += ["--gossip", "push"]
    p = start(args, tmp_path, ranks)
    try:
        wait_for_steps(run_dir, 8, rank=1 if method == "easgd" else 0)   # easgd: rank 0 serves
        victim = rank_pids(str(run_dir))[-1]           # one rank, not the launcher
        os.kill(victim, sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
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
    p = start(args, tmp_path, 3)
    try:
        wait_for_steps(run_dir, 30)
        while not ckpt.listing(ckpt.checkpoint_dir(run_dir)):
            time.sleep(0.05)
        os.kill(rank_pids(str(run_dir))[-1], signal.SIGKILL)
        t = time.monotonic()
        p.communicate(timeout=30)                      # bounded: the launcher ends the others
        assert time.monotonic() - t < 30
    finally:
        p.kill()
    assert p.returncode != 0
    assert rank_pids(str(run_dir)) == []
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
    p = run_cli(["--init-from", str(ckpt.listing(ckpt.checkpoint_dir(run_dir))[-1]), "--data", str(data),
                 *TINY, "--width", "0.5", "--run-dir", str(tmp_path / "w")], tmp_path)
    one_line_error(p, "is not this run's")


@MPI
def test_resume_with_another_rank_count_or_a_corrupt_checkpoint_is_refused(tmp_path, data):
    run_dir = tmp_path / "run"
    args = ["--data", str(data), "--method", "allreduce", *TINY, "--epochs", "2",
            "--checkpoint-every", "1", "--run-dir", str(run_dir)]
    assert run_cli(args, tmp_path, launcher=launch(2)).returncode == 0
    p = run_cli(["--resume", str(run_dir)], tmp_path, launcher=launch(3))
    one_line_error(p, "written by 2 ranks of 'allreduce', this job has 3 ranks")
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
    env_run = dict(os.environ, SCALESGD_INJECT_FAULT=f"{rank}:3", OMP_NUM_THREADS="1")
    t = time.monotonic()
    p = subprocess.run([*launch(ranks), sys.executable, "-m", "src.main", "--data", str(data),
                        "--method", method, *TINY, "--epochs", "20", "--batch-size", "4",
                        "--run-dir", str(tmp_path / "run")], cwd=ROOT, env=env_run,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t < 60
    assert p.returncode != 0
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("scalesgd: error")]
    # an unexpected exception also shows its traceback; the one error line names rank and cause
    assert len(errors) == 1 and f"(rank {rank}/{ranks})" in errors[0], p.stderr
    assert "injected fault" in errors[0]
