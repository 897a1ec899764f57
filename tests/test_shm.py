"""MPI shared-memory segments in /dev/shm: an aborted job frees its own, and the stale-segment
cleaner (run by slurm/run.sh after a failed step) removes exactly the unused ones.
Real mpiexec jobs, real /dev/shm files, real processes mapping them."""
import mmap
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import ROOT, TINY, rank_pid
from mpirun import mpi_launcher, uses_mpi
from synth import make_dataset

from scalesgd.comm import shm

pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm")


def processes_tagged(tag: str) -> list[str]:
    """PIDs of live processes whose environment holds SCALESGD_TEST_TAG=tag."""
    pids, needle = [], f"SCALESGD_TEST_TAG={tag}".encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    pids.append(entry.name)
            except OSError:
                continue
    return pids


@uses_mpi
@pytest.mark.parametrize("how", ["mpi_abort", "sigkill"])
def test_a_job_that_dies_leaves_no_segment(tmp_path, how):
    """Rank 2 of 4 raises mid-training (SCALESGD_INJECT_FAULT: the job ends in MPI_Abort, which
    skips MPI_Finalize), or one rank is SIGKILLed once training runs (issue 26: one segment was left
    per kill, since no rank of the job runs any cleanup).  The segments its ranks mapped (seen in
    /proc/PID/maps while it ran, unlinked or not) must be gone afterwards: MPICH's node segment is
    unlinked as soon as every rank of the node has mapped it, and an aborting rank unlinks what it
    maps."""
    data = make_dataset(tmp_path / "data", n=64, n_val=16, num_classes=4)
    tag = uuid.uuid4().hex
    env = dict(os.environ, OMP_NUM_THREADS="1", SCALESGD_TEST_TAG=tag)
    if how == "mpi_abort":
        env["SCALESGD_INJECT_FAULT"] = "2:4"
    proc = subprocess.Popen([*mpi_launcher(4), sys.executable, "-m", "src.main", "--data", str(data),
                             "--method", "allreduce", *TINY, "--epochs", "20", "--batch-size", "4",
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen: set[Path] = set()
    killed = None
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        pids = processes_tagged(tag)
        for pid in pids:
            seen |= {p for p in shm.mapped_files(pid, deleted=True) if shm.is_mpi_segment(p)}
        training = any((tmp_path / "run" / "metrics").glob("rank-*.jsonl"))
        if how == "sigkill" and killed is None and training and seen:
            killed = rank_pid(str(tmp_path / "run"), 2)       # a rank (not the launcher or a proxy)
            os.kill(killed, 9)
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode not in (0, None), err
    assert ("injected fault" in err) if how == "mpi_abort" else killed is not None, err
    assert seen, f"never saw the job's /dev/shm segment in /proc/PID/maps\n{err}"
    left = sorted(str(p) for p in seen if p.exists())
    assert not left, f"segments left by the job ({how}): {left}\n{err}"


def test_cleaner_removes_only_unused_segments_of_this_user(tmp_path):
    """Three files in /dev/shm: an MPI-named one mapped by a live process (kept), an MPI-named one
    nobody maps (removed) and another name (kept).  Run as slurm/run.sh runs it: the file path."""
    stem = f"scalesgdtest{os.getpid()}{uuid.uuid4().hex[:6]}"
    mapped, stale, other = (shm.SHM_DIR / f"mpich_shm_{stem}_0", shm.SHM_DIR / f"mpich_shm_{stem}_1",
                            shm.SHM_DIR / f"notmpi_{stem}")
    for p in (mapped, stale, other):
        p.write_bytes(b"\0" * mmap.PAGESIZE)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import mmap, sys, time\n"
                               f"f = open({str(mapped)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0); f.close()\n"
                               "print('mapped', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        p = subprocess.run([sys.executable, "src/scalesgd/comm/shm.py"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert str(stale) in p.stdout and str(mapped) not in p.stdout, p.stdout
        assert not stale.exists() and mapped.exists() and other.exists()
        holder.kill()
        holder.wait(10)
        assert shm.stale_segments().count(mapped) == 1      # unmapped now: next in line
    finally:
        holder.kill()
        for p in (mapped, stale, other):
            p.unlink(missing_ok=True)


def test_a_segment_unlinked_while_in_use_counts_as_in_use():
    """A live process maps one segment and holds another open, then both are unlinked (what
    ``release_node_segment`` does to MPICH's node segment right after MPI_Init): ``in_use`` still
    names both, so a scan that listed them just before cannot take them for stale (the emulated
    cluster's leak check once did, for a neighbouring job's segment)."""
    stem = f"scalesgdtest{os.getpid()}{uuid.uuid4().hex[:6]}"
    mapped, held = shm.SHM_DIR / f"mpich_shm_{stem}_0", shm.SHM_DIR / f"mpich_shm_{stem}_1"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import mmap, os, sys, time\n"
                               f"f = open({str(mapped)!r}, 'w+b')\n"
                               "f.write(b'\\0' * mmap.PAGESIZE); f.flush()\n"
                               "m = mmap.mmap(f.fileno(), 0); f.close()\n"
                               f"g = open({str(held)!r}, 'w+b')\n"
                               f"os.unlink({str(mapped)!r}); os.unlink({str(held)!r})\n"
                               "print('unlinked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "unlinked"
        assert not mapped.exists() and not held.exists()
        used = shm.in_use()
        assert mapped in used and held in used, sorted(str(p) for p in used)
        assert mapped not in shm.mapped_files(holder.pid) and held not in shm.open_files(holder.pid)
    finally:
        holder.kill()
        holder.wait(10)
        for p in (mapped, held):
            p.unlink(missing_ok=True)
