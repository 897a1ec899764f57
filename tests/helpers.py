"""What many test modules share to run the program as a user does: the repository root, the tiny
training flags, one CLI run as a real process, and the checks of its one-line error or warnings."""
import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import pytest

from mpirun import mpi_launcher, run_launched

ROOT = Path(__file__).resolve().parents[1]
# a ResNet-20 at a quarter width on 16x16 crops, one epoch, a metrics line per step: seconds per run
TINY = ["--width", "0.25", "--image-size", "16", "--scale", "16,20", "--batch-size", "8",
        "--epochs", "1", "--log-every", "1"]
# TINY's model and data as a job file (a study file's task: plan's tests)
TINY_JOB = """[model]
width = 0.25
[data]
image_size = 16
scale = [16.0, 20.0]
batch_size = 8
[train]
log_every = 1
"""


@functools.cache
def _digits_built_once() -> Path | None:
    """The built-in digits, built once per test process (a pytest worker) in a temporary folder;
    None where they cannot be built here (an environment without scikit-learn, such as the Open MPI
    quick run's, whose tests train on their own data)."""
    from scalesgd.data.demo import build_digits
    folder = Path(tempfile.mkdtemp(prefix="scalesgd-test-digits-"))
    atexit.register(shutil.rmtree, folder, True)
    try:
        return build_digits(folder / "digits")
    except ImportError:
        return None


def demo_data(tmp_path) -> str:
    """``SCALESGD_DATA`` for a test's runs: ``tmp_path/digits``, a copy of the digits this process
    built once, which the program finds built and reuses (a build is 1,797 JPEG encodings); left
    empty where they cannot be built here.  The program's own first-use build is run by
    test_demo.py, test_netcluster.py and test_data.py."""
    folder = tmp_path / "digits"
    built = None if folder.exists() else _digits_built_once()
    if built is not None:
        shutil.copytree(built, folder)
    return str(folder)


def one_cpu() -> list[str]:
    """The argv prefix (``taskset -c CPU``) that runs a command on one CPU under pytest-xdist: this
    worker's own (worker k: the k-th allowed CPU, round robin), as ``srun --cpus-per-task=1`` binds
    a task.  The program sizes its BLAS and DALI threads by its CPUs (``backend.blas_threads_for``;
    the OMP_NUM_THREADS=1 that ``run_cli`` sets caps them at one): left with both cores beside the
    other worker's jobs, a one-process run spun two BLAS threads on a shared core, about 3x the CPU
    time for the same run.  The ranks of an mpiexec job the command
    starts share that CPU (the MPICH progress throttle of conftest.py keeps their waits short; the
    program's own yield counts os.cpu_count(), not the mask).  Empty when the tests run one at a
    time, without taskset, or with SCALESGD_TEST_PIN=0 (to compare)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not worker.startswith("gw") or not count or int(count) < 2 or len(cpus) < 2 \
            or os.environ.get("SCALESGD_TEST_PIN") == "0" or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(cpus[int(worker[2:]) % len(cpus)])]


def launch(n: int) -> tuple:
    """The argv prefix of an N-rank job: nothing for one rank (a plain process), else mpiexec -n N."""
    return () if n == 1 else tuple(mpi_launcher(n))


def run_cli(args, tmp_path, timeout=180, launcher=(), module="src.main", env=None):
    """``[launcher...] python -m MODULE ARGS`` (the training program; ``scalesgd.virtual``: the
    virtual cluster) from the repository root, one BLAS thread, the demo's data under ``tmp_path``,
    ``env`` added; returns the CompletedProcess (text).  A launch that failed in a launcher's own
    start-up is tried once more (``mpirun.run_launched``; a plain process never shows it)."""
    env = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1", **(env or {}))
    return run_launched([*(launcher or one_cpu()), sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                        stdin=subprocess.DEVNULL, timeout=timeout)


def node_profile(tmp_path, name="two-a-node", **kw) -> str:
    """A virtual-cluster profile file of two ranks a node (``kw`` overrides), a fixed step, links
    slow enough that the communication shows; its path."""
    raw = {"name": name, "description": "test", "step_seconds": 0.02, "link_gbps": 1.0,
           "latency_us": 30, "ranks_per_node": 2, "intra_gbps": 50, "mem_gbps": 20, **kw}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def one_line_error(proc, *needles):
    """The process failed with exactly one ``scalesgd: error:`` line containing every needle."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("scalesgd: error")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def bad_sample_warnings(proc, needle):
    """The run succeeded; its stderr warns about skipped samples, each line naming ``needle``."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "skipped undecodable sample" in ln]
    assert lines and "Traceback" not in proc.stderr, proc.stderr
    for line in lines:
        assert line.startswith("scalesgd: warning: rank ") and needle in line, line
    return lines


def start(args, ranks: int, env: dict | None = None) -> subprocess.Popen:
    """``python -m src.main ARGS`` on ``ranks`` ranks in the background (``env`` added to the
    environment); end it with ``ended`` or ``stop``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.Popen([*launch(ranks), sys.executable, "-m", "src.main", *args], cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop(p: subprocess.Popen) -> tuple[str, str]:
    """Kills the job if it is still running (the launcher: MPICH's proxies and Open MPI's daemons
    then end its ranks); returns what it printed, or empty strings if that was read already."""
    p.kill()
    try:
        return p.communicate(timeout=30)
    except ValueError:                                  # communicate() had read it to the end
        return "", ""


def ended(p: subprocess.Popen, within: float, what: str) -> tuple[str, str]:
    """(stdout, stderr) of a job that ends by itself within ``within`` seconds.  A job still running
    then is a hang: it is killed and the test fails saying ``what``, with the job's output (not a
    bare TimeoutExpired)."""
    try:
        return p.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        pass
    out, err = stop(p)
    pytest.fail(f"{what}: the job was still running {within:.0f} s later (hang?)\n"
                f"stdout:\n{out}\nstderr:\n{err}")


def rank_pid(tag: str, rank: int) -> int:
    """PID of MPI rank ``rank`` among ``rank_pids(tag)`` (from the rank variable its launcher set:
    MPICH's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK)."""
    for pid in rank_pids(tag):
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.split(b"=", 1) for e in raw if b"=" in e)
        if int(env.get(b"PMI_RANK", env.get(b"OMPI_COMM_WORLD_RANK", b"-1"))) == rank:
            return pid
    raise AssertionError(f"no rank {rank} among the processes of {tag}")


def rank_pids(tag: str) -> list[int]:
    """PIDs of the Python ranks whose command line contains ``tag`` (e.g. their run directory)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and os.path.basename(cmd[0]).startswith(b"python") and any(tag.encode() in c for c in cmd):
                out.append(int(d.name))
    return out


def ranks_left(tag: str, grace: float = 10) -> list[int]:
    """The ranks (``rank_pids(tag)``) still alive ``grace`` seconds after their job ended, polled:
    a launcher may return while the ranks it killed are still exiting."""
    t = time.monotonic()
    while (left := rank_pids(tag)) and time.monotonic() - t < grace:
        time.sleep(0.05)
    return left


def final_arrays(run_dir: Path) -> dict:
    """Every dataset of the newest checkpoint of ``run_dir``, by 'rank-K/name'."""
    from scalesgd.io import checkpoint as ckpt
    path = ckpt.listing(ckpt.checkpoint_dir(run_dir))[-1]
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset)
                     else None)
    return out
