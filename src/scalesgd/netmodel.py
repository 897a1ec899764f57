"""The closed forms of communication and memory time, in one place: the virtual cluster's clock
(``virtual/cluster.py``: message by message, with each node's NIC queues on top) and ``plan``'s
network balance (``virtual/plan.py``).  Seconds and bytes; a
link moves ``bps`` bytes per second each way and costs ``latency`` seconds per message.

Pure arithmetic, evaluated in one fixed order: a re-timing or a replay that goes through these
gives the same bits as the run it re-times.
"""
from __future__ import annotations


def transfer_seconds(nbytes: float, bps: float, latency: float = 0.0) -> float:
    """One message of ``nbytes`` over one link, nothing else on it: ``latency + nbytes / bps``."""
    return latency + nbytes / bps


def ring_allreduce_seconds(nbytes: float, members: int, bps: float, latency: float = 0.0) -> float:
    """A ring all-reduce (reduce-scatter, then all-gather: the large-message algorithm of MPI and
    NCCL) of ``nbytes`` among ``members``: ``2 (n - 1) / n * nbytes / bps + 2 (n - 1) latency``,
    0 for one member."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * nbytes / bps + 2 * (members - 1) * latency


def element_pass_seconds(nbytes: float, mem_bps: float, scale: float = 1.0, passes: int = 3) -> float:
    """Element-wise arithmetic over a flat buffer of ``nbytes`` (times ``scale``) at ``mem_bps``:
    ``passes`` sweeps of it (a mix or an update reads two vectors and writes one: 3)."""
    return passes * nbytes * scale / mem_bps
