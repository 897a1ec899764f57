"""Launch real ``mpiexec`` jobs from tests, always under a timeout so a deadlock fails, never hangs.

The launcher is ``$MPIEXEC`` if set, else the ``mpiexec`` next to this Python (the MPI wheel's), else
the one on PATH; ``$MPIEXEC_ARGS`` (split like a shell would) goes before ``-n N``, e.g. for Open MPI
as root on few cores: ``MPIEXEC_ARGS="--allow-run-as-root --oversubscribe"`` (see ``make test-openmpi``).
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def mpiexec() -> str | None:
    """$MPIEXEC, else the launcher next to this Python (the MPI wheel's), else the one on PATH."""
    if os.environ.get("MPIEXEC"):
        return os.environ["MPIEXEC"]
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi_launcher(n: int) -> list[str]:
    """The argv prefix that starts N ranks of the command after it: mpiexec, $MPIEXEC_ARGS, -n N."""
    return [mpiexec(), *shlex.split(os.environ.get("MPIEXEC_ARGS", "")), "-n", str(n)]


needs_mpi = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the [mpi] extra)")


def uses_mpi(test):
    """Decorates a test that launches mpiexec: marked ``mpi`` (what ``make test-openmpi`` runs) and
    skipped where there is no launcher."""
    return pytest.mark.mpi(needs_mpi(test))


def run_mpi(n: int, args: list[str], timeout: float = 120, env: dict | None = None, cwd=ROOT):
    """Runs ``mpiexec -n N python ARGS`` and returns the CompletedProcess; a timeout is a failure
    that says so (the job is killed, no rank survives)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]), **(env or {}))
    cmd = [*mpi_launcher(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"{shlex.join(mpi_launcher(n))} {' '.join(args)} did not finish within {timeout}s "
                    "(deadlock?)\n"
                    f"stdout:\n{out}\nstderr:\n{err}")


def check(proc, expect_ok: bool = True) -> str:
    """Asserts the job's exit status; returns stdout.  Failure messages carry both streams."""
    report = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    if expect_ok:
        assert proc.returncode == 0, report
    else:
        assert proc.returncode != 0, report
    return proc.stdout


def logging_launcher(tmp_path: Path, marker: str) -> tuple[Path, Path, dict]:
    """A wrapper of the real launcher that appends its argv to a log and drops ``marker``: (the
    wrapper, the log, the environment that makes a benchmark launch through it with the marker in
    MPIEXEC_ARGS), to check that something launches through $MPIEXEC and $MPIEXEC_ARGS."""
    log, wrapper = tmp_path / "argv.log", tmp_path / "mpiexec-wrapper"
    wrapper.write_text("#!/bin/bash\n"
                       f'echo "$*" >> {log}\n'
                       f'args=(); for a in "$@"; do [ "$a" = {marker} ] || args+=("$a"); done\n'
                       f'exec {mpiexec()} "${{args[@]}}"\n')
    wrapper.chmod(wrapper.stat().st_mode | 0o100)
    env = dict(os.environ, MPIEXEC=str(wrapper),
               MPIEXEC_ARGS=f"{marker} {os.environ.get('MPIEXEC_ARGS', '')}")
    return wrapper, log, env
