"""The distributed methods under real mpiexec, at several world sizes; every launch has a timeout."""
import pytest

from mpirun import check, needs_mpi, run_mpi

pytestmark = [pytest.mark.mpi, needs_mpi]


@pytest.mark.parametrize("ranks", [2, 3])
def test_allreduce_invariants(ranks):
    out = check(run_mpi(ranks, ["tests/mpi/allreduce_check.py"], timeout=180))
    assert out.count(": ok") == 3, out
