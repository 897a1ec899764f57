"""comm/ under real mpiexec where the method launches do not reach: a one-rank job (every check
that means something there, in one launch) and the collectives helpers at an odd world size.
Every launch has a timeout."""
import pytest

from mpirun import check, needs_mpi, run_mpi

pytestmark = [pytest.mark.mpi, needs_mpi]
COLLECTIVES = 4                    # checks in tests/mpi/collectives_check.py
ONE_RANK = COLLECTIVES + 4         # ... and in tests/mpi/one_rank_check.py (windows, all-reduce)


def test_one_rank_invariants():
    """Collectives, RMA windows aimed at oneself, the all-reduce method: -n 1, one launch."""
    out = check(run_mpi(1, ["tests/mpi/one_rank_check.py"], timeout=90))
    assert out.count(": ok") == ONE_RANK, out


def test_collectives_invariants():
    """Broadcasts, gathers of uneven lengths, reductions, the checkpoint funnel: 3 ranks."""
    out = check(run_mpi(3, ["tests/mpi/collectives_check.py"], timeout=60))
    assert out.count(": ok") == COLLECTIVES, out
