"""Errors a user meets on several ranks: said once, before anything is written, naming the cause.

Every case is a real 4-rank mpiexec launch that must fail with exactly one ``scalesgd: error`` line
and leave the run directory as it was (absent, or an earlier run's files unchanged)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import ROOT, TINY, launch, one_line_error, run_cli
from mpirun import mpi_launcher, needs_mpi, uses_mpi
from synth import make_dataset

from scalesgd.io import checkpoint as ckpt

# one worker for the module: its module-scoped fixture (runs made once) is built once under -n 2
pytestmark = [needs_mpi, pytest.mark.mpi, pytest.mark.xdist_group("errors")]


def tree_digest(d: Path) -> dict:
    return {str(p.relative_to(d)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A data set, a truncated copy, and two finished runs (resnet20 at two widths)."""
    root = tmp_path_factory.mktemp("errors")
    data = make_dataset(root / "data", n=48, n_val=16, num_classes=4)
    trunc = root / "trunc"
    shutil.copytree(data, trunc)
    shard = sorted(trunc.glob("train-*.h5"))[0]
    shard.write_bytes(shard.read_bytes()[:3000])
    runs = {}
    for name, width in (("narrow", "0.25"), ("wide", "0.5")):
        runs[name] = root / name
        p = run_cli(["--data", str(data), "--method", "allreduce", *TINY, "--width", width, "--epochs", "1",
                     "--batch-size", "4", "--run-dir", str(runs[name])], root, launcher=launch(2))
        assert p.returncode == 0, p.stderr
    garbage = root / "garbage.h5"
    garbage.write_bytes(b"not a checkpoint at all" * 100)
    return dict(root=root, data=data, trunc=trunc, garbage=garbage, **runs)


def test_errors_every_rank_hits_are_printed_once_and_write_nothing(world, tmp_path):
    w = world
    narrow_ckpt = ckpt.listing(ckpt.checkpoint_dir(w["narrow"]))[-1]
    base = ["--method", "allreduce", *TINY, "--batch-size", "4"]
    new = tmp_path / "new"
    cases = {   # name: (args, expected exit status, text the one line must contain); 4 ranks (resume: 2)
        "bad number": (["--lr", "abc"], 2, "schedule.lr"),
        "missing data": (["--data", str(tmp_path / "nowhere"), *base, "--run-dir", str(new)], 1, "nowhere"),
        "truncated shard": (["--data", str(w["trunc"]), *base, "--run-dir", str(new)], 1, "train-00000"),
        "too few samples": (["--data", str(w["data"]), *base, "--batch-size", "64", "--run-dir", str(new)],
                            1, "training samples"),
        "garbage init-from": (["--data", str(w["data"]), *base, "--init-from", str(w["garbage"]),
                               "--run-dir", str(new)], 1, str(w["garbage"])),
        "other model init-from": (["--data", str(w["data"]), *base, "--init-from", str(narrow_ckpt),
                                   "--width", "0.5", "--run-dir", str(new)], 1, "17,432 parameters"),
        "init-from into a finished run": (["--data", str(w["data"]), *base, "--width", "0.5", "--init-from",
                                           str(w["garbage"]), "--run-dir", str(w["wide"])], 1, "garbage"),
        "new run into a finished run": (["--data", str(w["data"]), *base, "--width", "0.5", "--run-dir",
                                         str(w["wide"])], 2, "already holds a run"),
        "resume with another model's checkpoint": (["--resume", str(_foreign(w, tmp_path))], 1,
                                                   "is not this run's"),
    }
    before = {k: tree_digest(w[k]) for k in ("narrow", "wide")}
    foreign_before = tree_digest(tmp_path / "foreign")
    with ThreadPoolExecutor(3) as pool:
        procs = dict(zip(cases, pool.map(
            lambda c: run_cli(c[0], w["root"], launcher=launch(2 if "--resume" in c[0] else 4)),
            cases.values())))
    for name, (args, code, needle) in cases.items():
        p = procs[name]
        line = one_line_error(p, needle)
        assert p.returncode == code, (name, p.returncode, p.stderr)
        assert "(rank" not in line, (name, line)          # the same on every rank: said without one
    assert not new.exists()                               # validated before anything was created
    assert {k: tree_digest(w[k]) for k in ("narrow", "wide")} == before
    assert tree_digest(tmp_path / "foreign") == foreign_before


def _foreign(w, tmp_path) -> Path:
    """A copy of the 'wide' run whose newest checkpoint is the narrow run's (another model)."""
    d = tmp_path / "foreign"
    shutil.copytree(w["wide"], d)
    for f in ckpt.listing(ckpt.checkpoint_dir(d)):
        f.unlink()
    src = ckpt.listing(ckpt.checkpoint_dir(w["narrow"]))[-1]
    target = ckpt.checkpoint_dir(d) / src.name
    shutil.copy(src, target)
    (d / "summary.json").unlink()
    return d


def test_a_diverging_loss_stops_the_run_naming_step_and_rank(world, tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(world["data"]), *TINY, "--batch-size", "4", "--lr", "1e30",
                 "--run-dir", str(run_dir)], tmp_path)
    line = one_line_error(p, "training loss became", "on rank 0", "lower --lr")
    assert "at step" in line
    assert not (run_dir / "summary.json").exists()


@uses_mpi
def test_a_diverging_allreduce_run_is_reported_once(world, tmp_path):
    """Issue 26: under all-reduce the replicas are identical, so every rank sees the loss become
    NaN at the same step, and every rank printed the error.  Now it is one shared error: one line."""
    p = run_cli(["--data", str(world["data"]), *TINY, "--batch-size", "4", "--lr", "1e30",
                 "--method", "allreduce", "--run-dir", str(tmp_path / "run")], tmp_path, launcher=launch(2))
    line = one_line_error(p, "training loss became non-finite",
                          "the replicas are identical, so every rank stops", "lower --lr")
    assert line.startswith("scalesgd: error: "), line     # rank 0 alone, not "error (rank r/p)"


def test_resumed_summary_times_are_cumulative(world, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(world["narrow"], run_dir)
    first = json.loads((run_dir / "summary.json").read_text())
    p = run_cli(["--resume", str(run_dir), "--epochs", "2"], tmp_path, launcher=launch(2))
    assert p.returncode == 0, p.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["allocations"] == 2 and first["allocations"] == 1
    assert s["wall_seconds"] > first["wall_seconds"] and s["train_seconds"] > first["train_seconds"]
    assert s["wall_seconds"] >= s["train_seconds"] + s["eval_seconds"] - 1e-6


def test_an_error_only_some_ranks_hit_names_them_and_ends_the_job(world, tmp_path):
    """Rank 0 finds the data, ranks 1-2 do not (e.g. a node without its local copy): the ranks that
    did not fail must not be left in a collective of the set-up (this once hung), and the one
    line names the failing ranks."""
    common = ["-m", "src.main", "--method", "allreduce", *TINY, "--batch-size", "4",
              "--run-dir", str(tmp_path / "run")]
    cmd = [*mpi_launcher(1), sys.executable, *common, "--data", str(world["data"]), ":",
           "-n", "2", sys.executable, *common, "--data", str(tmp_path / "nowhere")]
    p = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, OMP_NUM_THREADS="1"))
    one_line_error(p, "ranks 1,2/3:", "nowhere")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("gossip", [["pull"], ["push", "--gossip-overlap"]], ids=["pull", "push-overlap"])
def test_a_shared_error_in_training_frees_the_windows_before_mpi_finalize(world, tmp_path, gossip):
    """Every rank hits the same user error at step 3 of a gossip run (SCALESGD_INJECT_FAULT=*:3:shared),
    with its one-sided windows open (and, overlapped, its courier): one line, exit 1, and nothing from
    MPI_Finalize about what was left (MPICH's "pending references", UCX's "was not returned to mpool"
    and "destroying inuse region": the windows were not freed on that path)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", SCALESGD_INJECT_FAULT="*:3:shared")
    p = subprocess.run([*mpi_launcher(3), sys.executable, "-m", "src.main", "--data", str(world["data"]),
                        "--method", "gossip", "--gossip", *gossip, *TINY, "--batch-size", "4",
                        "--epochs", "2", "--run-dir", str(tmp_path / "run")], cwd=ROOT,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)
    one_line_error(p, "injected shared fault")
    assert p.returncode == 1, p.stderr
    for leak in ("pending", "not returned", "inuse region", "MPI_Abort"):   # (UCX writes to stdout)
        assert leak not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr
