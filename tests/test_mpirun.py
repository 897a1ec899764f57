"""The launcher can be chosen and given options: $MPIEXEC and $MPIEXEC_ARGS reach the real mpiexec,
from the tests' helper and from slurm/run.sh (run here without Slurm: SCALESGD_LAUNCHER=mpirun).

Each test puts a launcher option that sets an environment variable into MPIEXEC_ARGS (hydra's
``-genv NAME VALUE``, Open MPI's ``-x NAME=VALUE``), after whatever MPIEXEC_ARGS already holds
(``make test-openmpi`` needs its own), and MPIEXEC names a script that records its arguments and
then runs the real launcher: every rank must see the variable, and the script its arguments."""
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import (LAUNCHER_STARTUP_FAILURES, ROOT, SIGPIPE_SILENT, check, launcher_failed_to_start,
                    mpi_launcher, mpiexec, run_mpi, uses_mpi)
from synth import make_dataset

PRINT_PROBE = ["-c", "import os; print('probe=' + os.environ.get('SCALESGD_PROBE', 'unset'))"]


def set_env_option(name: str, value: str) -> list[str]:
    """The launcher's option that sets NAME=VALUE in every rank."""
    version = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True, timeout=30)
    return ["-x", f"{name}={value}"] if "Open MPI" in version.stdout else ["-genv", name, value]


def recording_launcher(tmp_path: Path) -> tuple[Path, Path]:
    """(a script that writes its arguments, one a line, to a log and execs the real mpiexec; the log)."""
    log, script = tmp_path / "argv.txt", tmp_path / "my-mpiexec"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {shlex.quote(str(log))}\n"
                      f"exec {shlex.quote(mpiexec())} \"$@\"\n")
    script.chmod(0o755)
    return script, log


@uses_mpi
def test_mpiexec_and_its_args_reach_every_rank(tmp_path, monkeypatch):
    script, log = recording_launcher(tmp_path)
    option = set_env_option("SCALESGD_PROBE", "a b")            # a value with a space: shlex keeps it
    before = os.environ.get("MPIEXEC_ARGS", "")
    monkeypatch.setenv("MPIEXEC_ARGS", f"{before} {shlex.join(option)}")
    monkeypatch.setenv("MPIEXEC", str(script))
    assert mpi_launcher(2) == [str(script), *shlex.split(before), *option, "-n", "2"]
    out = check(run_mpi(2, PRINT_PROBE, timeout=60))
    assert out.count("probe=a b") == 2 and "unset" not in out, out     # hydra may interleave lines
    assert log.read_text().splitlines() == [*shlex.split(before), *option, "-n", "2", sys.executable,
                                            *PRINT_PROBE]


@uses_mpi
def test_run_sh_passes_mpiexec_args_to_the_launcher(tmp_path):
    """slurm/run.sh with SCALESGD_LAUNCHER=mpirun outside Slurm: 2 ranks of a dry run (no training)."""
    script, log = recording_launcher(tmp_path)
    data = make_dataset(tmp_path / "d", n=16, n_val=8, num_classes=4)
    option = set_env_option("SCALESGD_PROBE", "7")
    env = dict(os.environ, SCALESGD_LAUNCHER="mpirun", SLURM_NTASKS="2",
               VENV=str(Path(sys.executable).parents[1]), MPIEXEC=str(script),
               MPIEXEC_ARGS=f"{os.environ.get('MPIEXEC_ARGS', '')} {' '.join(option)}",
               CONFIG="jobs/digits-allreduce.toml", DATA=str(data), RUN_DIR=str(tmp_path / "run"),
               EXTRA_ARGS="--dry-run --batch-size 8", SCALESGD_DEFAULT_NAME="t")
    env.pop("SLURM_JOB_ID", None)
    p = subprocess.run(["bash", "slurm/run.sh"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    argv = log.read_text().splitlines()
    n = argv.index("-n")
    assert argv[n - len(option):n + 2] == [*option, "-n", "2"], argv
    assert p.stdout.count('"method"') == 2, p.stdout              # each rank printed its config


def test_a_launcher_start_up_failure_is_told_from_a_failed_job():
    """Only the launcher's known message, with a non-zero status and no rank's output, counts."""
    msg = LAUNCHER_STARTUP_FAILURES[0]
    job = subprocess.CompletedProcess
    assert launcher_failed_to_start(job([], 213, "", f"---\n{msg}. We cannot\ncontinue.\n")) == msg
    assert launcher_failed_to_start(job([], 213, "rank 0 ran\n", msg)) is None      # a rank had run
    assert launcher_failed_to_start(job([], 0, "", msg)) is None
    assert launcher_failed_to_start(job([], 1, "", "Traceback ...\nValueError: x")) is None
    assert launcher_failed_to_start(job([], -13, "", "")) == SIGPIPE_SILENT     # hydra lost to SIGPIPE
    assert launcher_failed_to_start(job([], -13, "", "BAD TERMINATION")) is None    # something ran
    assert launcher_failed_to_start(job([], -15, "", "")) is None                # killed on purpose


def launch_probe(via: str, tmp_path):
    """Two ranks that each print a line, launched through ``run_mpi`` or ``helpers.run_cli``."""
    if via == "run_mpi":
        return run_mpi(2, PRINT_PROBE, timeout=60)
    from helpers import run_cli
    return run_cli([], tmp_path, timeout=60, launcher=mpi_launcher(2), module="platform")


@uses_mpi
@pytest.mark.parametrize("via", ["run_mpi", "run_cli"])
def test_a_launch_that_failed_to_start_is_tried_once_more(tmp_path, monkeypatch, via):
    """A launcher that fails its start-up once (as Open MPI's once did in CI): the job runs on the
    second launch, with a warning; one that always fails it is a failed job, launched twice.  Both
    ways the tests launch jobs: ``run_mpi``, and ``run_cli`` under a launcher."""
    count = tmp_path / "launches"
    script = tmp_path / "flaky-mpiexec"
    script.write_text("#!/bin/sh\n"
                      f"echo x >> {shlex.quote(str(count))}\n"
                      f'if [ "$(wc -l < {shlex.quote(str(count))})" -le "$FAILS" ]; then\n'
                      f"  printf '%s\\n' {shlex.quote(LAUNCHER_STARTUP_FAILURES[0] + '. We cannot')} >&2; "
                      "exit 213\n"
                      "fi\n"
                      f'exec {shlex.quote(mpiexec())} "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("MPIEXEC", str(script))
    monkeypatch.setenv("FAILS", "1")
    with pytest.warns(UserWarning, match="failed to start") as said:
        out = check(launch_probe(via, tmp_path))
    # each rank's line, counted by its text (the launcher may interleave the two ranks' output);
    # a launch hydra lost to SIGPIPE (mpirun.SIGPIPE_SILENT) is one more, said in a warning of its own
    mark = "probe=" if via == "run_mpi" else platform.platform()
    lost = sum(SIGPIPE_SILENT in str(w.message) for w in said)
    assert out.count(mark) == 2 and len(count.read_text().splitlines()) == 2 + lost
    count.unlink()
    monkeypatch.setenv("FAILS", "2")
    with pytest.warns(UserWarning, match="failed to start"):
        proc = launch_probe(via, tmp_path)
    assert proc.returncode == 213 and len(count.read_text().splitlines()) == 2
