"""The program as a user runs it: real processes, real shards, real mpiexec."""
import json
import os
import subprocess
import sys

import h5py
import pytest

from helpers import ROOT, TINY, bad_sample_warnings, demo_data, one_line_error, run_cli
from mpirun import mpi_launcher, mpiexec
from synth import make_dataset


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tiny"), n=48, n_val=20, num_classes=4)


def test_dry_run_prints_config_and_param_count(tmp_path):
    p = run_cli(["--dry-run"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "272,474 parameters" in p.stdout
    cfg = json.loads(p.stdout[:p.stdout.rindex("}") + 1])
    assert cfg["model"]["model"] == "resnet20"


def test_dry_run_refuses_an_occupied_run_dir_and_a_batch_the_data_cannot_fill(tmp_path, tiny_data):
    """What the run refuses before it starts, the dry run refuses too, in the same words: a run
    directory that holds a run (unless resumed), and a global batch over the training samples,
    where it knows the workers (one process: ``single`` only)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    p = run_cli(["--dry-run", "--run-dir", str(run_dir)], tmp_path)
    one_line_error(p, f"--run-dir {run_dir} already holds a run")
    assert p.returncode == 2
    resumed = run_cli(["--dry-run", "--run-dir", str(run_dir), "--resume", str(run_dir)], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    p = run_cli(["--dry-run", "--data", str(tiny_data), "--batch-size", "64"], tmp_path)
    one_line_error(p, "64 x 1 workers exceeds the 48 training samples")
    assert p.returncode == 1
    assert run_cli(["--dry-run", "--data", str(tiny_data), "--batch-size", "48"], tmp_path).returncode == 0
    manifest = json.loads((tiny_data / "manifest.json").read_text())      # a count the manifest does
    del manifest["splits"]["train"]["count"]                              # not give: left to the ranks
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in tiny_data.iterdir():
        (bare / f.name).symlink_to(f)
    (bare / "manifest.json").unlink()
    (bare / "manifest.json").write_text(json.dumps(manifest))
    assert run_cli(["--dry-run", "--data", str(bare), "--batch-size", "64"], tmp_path).returncode == 0


@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the [mpi] extra)")
def test_a_launched_dry_run_checks_the_rank_count_and_the_batch_the_run_would_use(tmp_path):
    """Under mpiexec the dry run knows the ranks (from the launcher's environment, no MPI started):
    it refuses, once, a method that cannot run on them, and checks the batch the run would use:
    unset, the demo's global batch of 64 split over the workers (32 x 2 fits 100 samples)."""
    data = ["--dry-run", "--data", str(make_dataset(tmp_path / "d", n=100, n_val=8, num_classes=4))]
    p = run_cli(data, tmp_path, launcher=mpi_launcher(2))
    one_line_error(p, "method 'single' trains on one rank, but this job has 2 ranks")
    assert run_cli([*data, "--method", "allreduce"], tmp_path, launcher=mpi_launcher(2)).returncode == 0
    p = run_cli([*data, "--method", "allreduce", "--batch-size", "64"], tmp_path, launcher=mpi_launcher(2))
    one_line_error(p, "64 x 2 workers exceeds the 100 training samples")
    assert p.returncode == 1


def test_short_training_run_writes_results(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(run_dir), *TINY], tmp_path)
    assert p.returncode == 0, p.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("method", "ranks", "model", "epochs", "samples", "val_top1_accuracy",
                "val_top5_accuracy", "images_per_second", "wall_seconds"):
        assert key in summary, key
    assert summary["ranks"] == 1 and summary["samples"] == 48 and summary["epochs"] == 1
    assert 0 <= summary["val_top1_accuracy"] <= summary["val_top5_accuracy"] == 1.0   # 4 classes
    # on NumPy there is no fast path to check: nothing ran, no time spent (fastpaths/)
    assert summary["fast_paths"] == {"mode": "auto", "seconds": 0.0, "gflops": 0.0, "components": {}}
    assert json.loads((run_dir / "config.json").read_text())["data"]["batch_size"] == 8
    steps = [json.loads(ln) for ln in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "step"] == list(range(1, 7))
    assert "step 6 epoch 1.00/1 ETA" in p.stdout and "validation top-1" in p.stdout


def test_a_thread_count_the_environment_sets_caps_the_blas_threads(tmp_path, tiny_data):
    """cores / ranks on the node, never more than OMP_NUM_THREADS (OPENBLAS_NUM_THREADS,
    MKL_NUM_THREADS: the least; OMP's first level); threadpoolctl would raise OpenBLAS above it.  A
    plain process on every core this test may use, with OMP_NUM_THREADS=1: one thread, said."""
    from scalesgd.backend import blas_threads_for, thread_cap
    assert blas_threads_for(2, cores=8, env={}) == 4
    assert blas_threads_for(2, cores=8, env={"OMP_NUM_THREADS": "1"}) == 1
    assert blas_threads_for(1, cores=8, env={"OMP_NUM_THREADS": "3,2", "MKL_NUM_THREADS": "6"}) == 3
    assert blas_threads_for(1, cores=2, env={"OPENBLAS_NUM_THREADS": "16"}) == 2
    assert thread_cap({"OMP_NUM_THREADS": "", "MKL_NUM_THREADS": "x"}) is None
    assert thread_cap({"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "2"}) == (2, "OPENBLAS_NUM_THREADS")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    p = subprocess.run([sys.executable, "-m", "src.main", "--data", str(tiny_data), "--run-dir", str(run_dir),
                        *TINY], cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=180, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert json.loads((run_dir / "summary.json").read_text())["blas_threads"] == 1
    assert "; 1 BLAS thread(s) (at most OMP_NUM_THREADS=1)" in p.stderr, p.stderr


@pytest.mark.parametrize("args,needles", [
    (["--model", "resnet19"], ["model.model", "resnet19"]),
    (["--lr", "fast"], ["schedule.lr", "fast"]),
    (["--frobnicate"], ["unrecognized arguments: --frobnicate"]),
    (["--config", "nope.toml"], ["nope.toml", "not found"]),
])
def test_bad_arguments(tmp_path, args, needles):
    p = run_cli(args, tmp_path)
    one_line_error(p, *needles)
    assert p.returncode == 2


def test_missing_data_dir_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tmp_path / "nowhere"), "--run-dir", str(run_dir)], tmp_path)
    one_line_error(p, "nowhere", "manifest")
    assert not run_dir.exists()


def test_corrupt_shard_names_the_file(tmp_path):
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4)
    shard = root / "train-00001-of-00002.h5"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 3])
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(root), "--run-dir", str(run_dir), *TINY], tmp_path)
    one_line_error(p, "train-00001-of-00002.h5")
    assert not run_dir.exists()


def test_label_out_of_range_names_file_and_index(tmp_path):
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4)
    with h5py.File(root / "val-00000-of-00001.h5", "r+") as f:
        f["labels"][5] = 9
    p = run_cli(["--data", str(root), "--run-dir", str(tmp_path / "run"), *TINY], tmp_path)
    one_line_error(p, "val-00000-of-00001.h5", "[5]", "9")


def test_unreadable_jpeg_is_skipped_named_and_counted(tmp_path):
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4, bad=30)   # shard 1 = 24..47
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(root), "--run-dir", str(run_dir), *TINY], tmp_path)
    assert len(bad_sample_warnings(p, "train-00001-of-00002.h5[6]")) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["bad_samples"] == 1 and summary["samples"] == 48       # no step lost


def test_a_resumed_run_counts_bad_samples_on_from_its_checkpoint(tmp_path):
    """Issue 26: a resumed run counted bad samples from zero (the history's count dropped at the
    first evaluation after the resume) and warned again about samples the first allocation had
    warned about.  Now the count and what the loaders know are in the checkpoint: one warning per
    sample per job, a count that never drops, and the final count of an uninterrupted run."""
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4, bad=[3, 30], val_garbage=5)
    args = ["--data", str(root), *TINY, "--eval-every", "0.5"]
    whole, run = tmp_path / "whole", tmp_path / "run"
    p = run_cli([*args, "--epochs", "2", "--run-dir", str(whole)], tmp_path)
    assert p.returncode == 0, p.stderr
    first = run_cli([*args, "--epochs", "1", "--run-dir", str(run)], tmp_path)
    second = run_cli(["--resume", str(run), "--epochs", "2"], tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    warned = [ln.split("sample ", 1)[1].split(" (")[0] for proc in (first, second)
              for ln in proc.stderr.splitlines() if "skipped undecodable sample" in ln]
    assert sorted(warned) == sorted(set(warned)) and len(warned) == 3, warned
    counts = [h["bad_samples"] for h in json.loads((run / "summary.json").read_text())["history"]]
    assert counts == sorted(counts), counts                   # never drops at the resume
    want = json.loads((whole / "summary.json").read_text())["bad_samples"]
    assert json.loads((run / "summary.json").read_text())["bad_samples"] == want == 3


@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the [mpi] extra)")
def test_several_ranks_are_refused_together(tmp_path, tiny_data):
    """Until the distributed methods land, -n 2 with the single method fails on every rank, fast."""
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(tmp_path / "run"), *TINY], tmp_path,
                timeout=60, launcher=mpi_launcher(2))
    report = f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.returncode != 0, report
    assert "method 'single' trains on one rank, but this job has 2 ranks" in p.stderr, report
    assert p.stderr.count("scalesgd: error") == 1, report      # rank 0 reports it, once
    assert "Traceback" not in p.stderr


@pytest.mark.mpi
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the [mpi] extra)")
def test_one_ranks_bad_sample_does_not_stop_the_job(tmp_path):
    """A bad JPEG read by one rank only: that rank names it and replaces it, both ranks run the
    same number of steps (the gradient all-reduce would hang otherwise), the summary counts it."""
    root = make_dataset(tmp_path / "d", n=48, n_val=20, num_classes=4, bad=30)
    p = run_cli(["--data", str(root), "--run-dir", str(tmp_path / "run"), "--method", "allreduce", *TINY],
                tmp_path, timeout=60, launcher=mpi_launcher(2))
    assert len(bad_sample_warnings(p, "train-00001-of-00002.h5[6]")) == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["bad_samples"] == 1 and summary["samples"] == 48


def test_help_lists_every_choice_and_section_and_version_is_setup_cfgs(tmp_path):
    """--help shows each enum-like key's choices (as config/ validates them) and every job-file
    section; --version prints setup.cfg's version."""
    import configparser

    from scalesgd import config as C
    p = run_cli(["--help"], tmp_path)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())                  # argparse wraps at the terminal width
    for flag in ("--method {single,allreduce,easgd,asgd,gossip,localsgd}", "--gossip {pull,push}",
                 "--device {cpu,gpu,auto}", "--dtype {float32,float64}",
                 "--augment {multiscale,rrc,center}", "--schedule {constant,step,cosine}",
                 "--model {resnet18,"):
        assert flag in text, flag
    with_choices = 0
    for section in C.SECTIONS:
        for f, meta in C.fields_of(section):
            if meta.get("choices"):
                with_choices += 1
                flag = C.flag_name(section, f.name).replace("_", "-")
                assert f"--{flag} {{{','.join(map(str, meta['choices']))}}}" in text, flag
    assert with_choices >= 10
    sections = " ".join(f"[{s}]" for s in C.SECTIONS)
    assert f"TOML job file (sections {sections})" in text and "[dist]" in sections
    p = run_cli(["--version"], tmp_path)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert p.returncode == 0 and p.stdout.strip() == f"scalesgd {cfg['metadata']['version']}", p


@pytest.mark.parametrize("mask", [0o002, 0o077])
def test_result_files_follow_the_umask(tmp_path, mask):
    """Issue 26: the atomic writes (config.json, summary.json, checkpoints) were 0600 whatever the
    umask, while the metrics followed it; on a shared cluster a group could not read the results.
    Now every file of the run directory has the mode a plain open() gives under the umask."""
    env = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "src.main", *TINY, "--run-dir", str(run)], cwd=ROOT,
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
                       preexec_fn=lambda: os.umask(mask))
    assert p.returncode == 0, p.stderr
    files = [f for f in run.rglob("*") if f.is_file()]
    names = {f.name for f in files}
    assert {"config.json", "summary.json"} <= names and any(n.endswith(".h5") for n in names), names
    modes = {str(f.relative_to(run)): oct(f.stat().st_mode & 0o777) for f in files}
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes
