"""The MPI checks that mean something on a one-rank job, in one launch:
``mpiexec -n 1 python tests/mpi/one_rank_check.py``.

A one-rank job takes branches no multi-rank launch reaches (``size == 1`` shortcuts, a rank that is
every window's target and the root of every collective): the collectives helpers, the RMA windows
aimed at oneself, and the all-reduce method (buckets, replicas against the serial reference,
evaluation).  The parameter-server methods need two ranks and the gossip protocol checks a peer, so
they are not here.  The checks are the multi-rank scripts' own functions, imported, not copies.
"""
from allreduce_check import (bn_statistics_averaged_for_evaluation, closed_form_buckets,
                             replicas_identical_and_equal_to_serial)
from collectives_check import CHECKS as COLLECTIVES
from gossip_check import windows_on_oneself
from harness import run_checks
from mpi4py import MPI

CHECKS = (*COLLECTIVES, windows_on_oneself, closed_form_buckets, replicas_identical_and_equal_to_serial,
          bn_statistics_averaged_for_evaluation)

if __name__ == "__main__":
    assert MPI.COMM_WORLD.size == 1, "run me on one rank (mpiexec -n 1)"
    run_checks(*CHECKS)
