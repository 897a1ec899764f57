"""The distributed methods under real mpiexec, at several world sizes; every launch has a timeout."""
import pytest

from mpirun import check, needs_mpi, run_mpi

pytestmark = [pytest.mark.mpi, needs_mpi]


ALLREDUCE_CHECKS = 3          # the checks tests/mpi/allreduce_check.py runs


@pytest.mark.parametrize("ranks", [2, 3])
def test_allreduce_invariants(ranks):
    out = check(run_mpi(ranks, ["tests/mpi/allreduce_check.py"], timeout=180))
    assert out.count(": ok") == ALLREDUCE_CHECKS, out


LOCALSGD_CHECKS = 4           # the checks tests/mpi/localsgd_check.py runs


def test_localsgd_invariants():
    """3 ranks: tau = 1 is synchronous SGD; replicas drift for tau steps, then average (params and BN
    statistics); SlowMo's outer step follows its formula and survives a checkpoint; the evaluated
    model is the average."""
    out = check(run_mpi(3, ["tests/mpi/localsgd_check.py"], timeout=180))
    assert out.count(": ok") == LOCALSGD_CHECKS, out
