"""The transport contract's closed-form checks (``comm/contract.py``), written against a
``Transport`` only, so the same lines check both implementations: ``tests/test_transport_contract.py``
runs them on the virtual cluster's in-process transport, and as
``mpiexec -n P python tests/mpi/transport_contract.py`` on ``MPITransport``.  Rank r contributes
values built from r; every result is checked against what the ranks' inputs give."""
import functools

import numpy as np


def is_a_transport(net):
    """Every member of the contract, data attributes included, on a live transport."""
    from scalesgd.comm.contract import Transport
    assert isinstance(net, Transport), [m for m in dir(Transport) if not hasattr(net, m)]
    assert net.name in ("mpi", "virtual") and 0 <= net.rank < net.size
    assert isinstance(net.spans_nodes, bool) and isinstance(net.clock(), float)


def broadcasts(net):
    r, root = net.rank, net.size - 1
    a = np.arange(1000.0) + r
    net.broadcast(a, root)
    assert np.array_equal(a, np.arange(1000.0) + root), a[:3]
    for text in ("x" * 5000, "", "µ-rank ✓"):
        assert net.bcast_text(text if r == root else None, root) == text
    assert net.bcast_text(f"from {r}") == "from 0"


def gathers(net):
    p, r = net.size, net.rank
    assert net.allgather_text("é" * r) == ["é" * k for k in range(p)]
    values, owners = net.allgather_int64(np.arange(r, dtype=np.int64) + 10 * r)
    assert values.tolist() == [10 * k + i for k in range(p) for i in range(k)], values
    assert owners.tolist() == [k for k in range(p) for _ in range(k)] and values.dtype == np.int64


def reductions(net):
    p, r = net.size, net.rank
    v = np.array([r, -r, 1], np.int64)
    assert net.allreduce_sum_host(v).tolist() == [p * (p - 1) // 2, -p * (p - 1) // 2, p]
    assert net.allreduce_max_host(v).tolist() == [p - 1, 0, 1]
    assert net.iallreduce_max_host(v, poll=lambda: None).tolist() == [p - 1, 0, 1]
    assert v.tolist() == [r, -r, 1]                               # the input is left as it was
    x = np.full(7, float(r))
    net.allreduce_mean(x)
    assert np.allclose(x, (p - 1) / 2), x
    net.barrier()


def funnel_in_rank_order(net):
    r, got = net.rank, []
    net.funnel({"w": np.arange(6.0).reshape(2, 3) * (r + 1), "n": np.array([r], np.int64)}, f"rank {r}",
               lambda src, arrays, text: got.append((src, arrays["w"].tolist(), arrays["n"].tolist(), text)))
    want = [(k, (np.arange(6.0).reshape(2, 3) * (k + 1)).tolist(), [k], f"rank {k}") for k in range(net.size)]
    assert got == (want if r == 0 else []), got


def split_by_parity(net):
    """A sub-transport of the ranks of one parity, ordered by descending rank: its own collectives."""
    sub = net.split(net.rank % 2, -net.rank)
    mine = [k for k in range(net.size) if k % 2 == net.rank % 2][::-1]
    assert sub.size == len(mine) and sub.rank == mine.index(net.rank), (sub.size, sub.rank)
    assert sub.allgather_text(str(net.rank)) == [str(k) for k in mine]
    assert sub.allreduce_sum_host(np.array([net.rank], np.int64)).tolist() == [sum(mine)]
    sub.free()


CHECKS = (is_a_transport, broadcasts, gathers, reductions, funnel_in_rank_order, split_by_parity)


def over_comm(check):
    """``check(net)`` as the MPI harness's ``check(comm)``, on the job's ``MPITransport``."""
    from scalesgd.comm.mpi.transport import MPITransport

    @functools.wraps(check)
    def run(comm):
        check(MPITransport(comm))
    return run


if __name__ == "__main__":
    from harness import run_checks
    run_checks(*map(over_comm, CHECKS))
