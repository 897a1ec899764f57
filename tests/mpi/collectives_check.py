"""comm/mpi/collectives.py helpers at any world size, 1 included, run as
``mpiexec -n P python tests/mpi/collectives_check.py``.

Each helper is checked against a closed form of the ranks' inputs (rank r contributes values built
from r), so one rank and several ranks are checked by the same lines: the one-rank path is where a
helper that special-cases ``size == 1`` (or forgets to) goes wrong unseen.
"""
import numpy as np
from harness import run_checks

from scalesgd.comm.mpi import collectives as K


def broadcasts(comm):
    """bcast of a flat array and bcast_text (long, empty, non-ASCII) from the last rank."""
    r, root = comm.rank, comm.size - 1
    a = np.arange(1000.0) + r                            # root's holds arange + root
    K.bcast(comm, a, root)
    assert np.array_equal(a, np.arange(1000.0) + root), a[:3]
    for text in ("x" * 5000, "", "µ-rank ✓"):
        got = K.bcast_text(comm, text if r == root else None, root)
        assert got == text, (got[:20], text[:20])
    assert K.bcast_text(comm, f"from {r}", 0) == "from 0"


def gathers(comm):
    """allgather_text and allgather_int64 with per-rank lengths 0.. (rank 0 gives nothing)."""
    p, r = comm.size, comm.rank
    texts = K.allgather_text(comm, "é" * r)
    assert texts == ["é" * k for k in range(p)], texts
    values, owners = K.allgather_int64(comm, np.arange(r, dtype=np.int64) + 10 * r)
    want = [10 * k + i for k in range(p) for i in range(k)]
    assert values.tolist() == want and owners.tolist() == [k for k in range(p) for _ in range(k)]
    assert values.dtype == np.int64, values.dtype


def reductions(comm):
    """Sums, maxima (blocking, and non-blocking with a poll that runs), in-place mean."""
    p, r = comm.size, comm.rank
    v = np.array([r, -r, 1], np.int64)
    assert K.allreduce_sum_host(comm, v).tolist() == [p * (p - 1) // 2, -p * (p - 1) // 2, p]
    assert K.allreduce_max_host(comm, v).tolist() == [p - 1, 0, 1]
    got = K.iallreduce_max_host(comm, v, poll=lambda: None)     # polled while it waits, if it waits
    assert got.tolist() == [p - 1, 0, 1] and v.tolist() == [r, -r, 1], got
    assert K.iallreduce_max_host(comm, v).tolist() == [p - 1, 0, 1]
    x = np.full(7, float(r))
    K.allreduce_mean(comm, x)
    assert np.allclose(x, (p - 1) / 2), x


def funnel_reaches_the_root_in_rank_order(comm):
    """Every rank's arrays (several dtypes and shapes, an empty one) and text reach the sink on the
    root, once per rank, in rank order, bit for bit."""
    r = comm.rank
    mine = {"w": np.arange(6.0).reshape(2, 3) * (r + 1), "n": np.array([r], np.int64),
            "empty": np.zeros(0, np.float32)}
    got = []
    K.funnel(comm, mine, f"rank {r}", lambda src, arrays, text: got.append((src, arrays, text)))
    if r != 0:
        assert got == [], "the sink runs on the root only"
        return
    assert [g[0] for g in got] == list(range(comm.size)) and [g[2] for g in got] == \
        [f"rank {k}" for k in range(comm.size)]
    for src, arrays, _ in got:
        assert np.array_equal(arrays["w"], np.arange(6.0).reshape(2, 3) * (src + 1))
        assert arrays["n"].tolist() == [src] and arrays["n"].dtype == np.int64
        assert arrays["empty"].shape == (0,) and arrays["empty"].dtype == np.float32


CHECKS = (broadcasts, gathers, reductions, funnel_reaches_the_root_in_rank_order)

if __name__ == "__main__":
    run_checks(*CHECKS)
