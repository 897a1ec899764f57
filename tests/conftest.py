import compileall
import os
import sys

import pytest

# MPICH's ranks poll without pause while they wait; the tests run 3-4 ranks (and two tests at a time)
# on 2 cores, where a polling rank takes the core from one that computes.  After 64 polls that found
# nothing, a usleep(1) gives it back (measured: the 4-rank EASGD digits job 14.8-16.5 -> 13.4-13.5 s,
# a fifth less CPU).  MPICH's own setting, ignored by Open MPI; a test's environment may override it.
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE", "1")
os.environ.setdefault("MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT", "64")

# tests import their helpers (gradcheck) by module name, and the benchmark scripts and packages
# (benchlib, crossover, sweeps) as a script of benchmarks/ does: by name, benchmarks/ on the path;
# the package comes from src/ when not installed
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, SRC)

# Some machines set PYTHONDONTWRITEBYTECODE=1 (this project's do).  Then every rank of every test
# compiled the package from source again: 0.6 s of CPU to import what a rank imports, against 0.45
# from bytecode, and a tenth of test_errors.py's CPU (46-47 s against 50-52).  The suite's
# processes share one compiled copy instead: compiled here (once; what is current is skipped) and
# read, or written where missing, by every process the tests start.  (__pycache__ is ignored by git.)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
compileall.compile_dir(SRC, quiet=2)     # quiet=2: a read-only checkout just runs from source


def pytest_itemcollected(item):
    """Under ``pytest -n 2`` (pytest-xdist, ``--dist loadgroup``: what ``make test`` runs), the tests
    that touch what the whole machine shares run on one worker, one after another: a one-node Slurm
    cluster, emulated nodes (namespaces, rate limits), and the MPI segments in /dev/shm (Slurm's
    run.sh, the emulated-node tool and test_shm.py each remove the stale ones they find, which can
    be a segment another test planted).  Marked as each test is collected."""
    if item.path.name == "test_shm.py" or any(item.get_closest_marker(m) for m in ("slurm", "netcluster")):
        item.add_marker(pytest.mark.xdist_group("machine"))


# SCALESGD_TEST_CPU=FILE: each test's wall seconds and CPU seconds (the pytest process's own and
# those of the processes it started and waited for: mpiexec and its ranks), one JSON line a test,
# appended by every worker, to find where the suite's time goes (not what a job under Slurm spends);
# with its start (Unix time) and worker, to see how evenly the workers' queues end.
CPU_LOG = os.environ.get("SCALESGD_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    import json
    import resource
    import time

    def cpu(who):
        r = resource.getrusage(who)
        return r.ru_utime + r.ru_stime
    start, t0 = time.time(), time.monotonic()
    s0, c0 = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
    yield
    line = dict(test=item.nodeid, start=round(start, 3), worker=os.environ.get("PYTEST_XDIST_WORKER", ""),
                wall=round(time.monotonic() - t0, 3),
                cpu_self=round(cpu(resource.RUSAGE_SELF) - s0, 3),
                cpu_children=round(cpu(resource.RUSAGE_CHILDREN) - c0, 3))
    with open(CPU_LOG, "a") as f:
        f.write(json.dumps(line) + "\n")
