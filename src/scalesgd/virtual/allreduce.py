"""The virtual cluster's gradient all-reducer (the ``allreduce`` method's sum).

``VirtualAllreducer``: the whole flat buffer summed over the transport's ranks in MPICH's
all-reduce order (``tree_sum``), once every rank finished backward, timed by the profile's
``allreduce_progress`` (``gradient_seconds``).
"""
from __future__ import annotations

import numpy as np

GRADIENT_KINDS = ("grad", "grad-overlap")   # cost kinds (tape)


def tree_sum(arrays: list) -> np.ndarray:
    """Sum of same-shaped arrays in MPICH's all-reduce order: pairs of neighbours, then pairs of
    pairs (recursive doubling); with p not a power of two, ranks 2i and 2i+1 (i < p - 2^k) are
    folded first.  A new array."""
    vals = [np.array(a, copy=True) for a in arrays]
    p = len(vals)
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    if rem:
        vals = [vals[2 * i] + vals[2 * i + 1] for i in range(rem)] + vals[2 * rem:]
    while len(vals) > 1:
        vals = [vals[i] + vals[i + 1] for i in range(0, len(vals), 2)]
    return vals[0]


def gradient_seconds(tr, kind: str, nbytes: int) -> float:
    """The gradient all-reduce of transport ``tr`` after the last rank's backward, by the profile's
    ``allreduce_progress``: ``async`` hides the part that fits under this rank's backward (two
    thirds of its step's compute) with overlap (``kind`` ends in ``-overlap``), down to an eighth;
    ``host`` moves only inside MPI: ``host_allreduce_factor`` times the ring formula, of which only
    the measured ``host_hidden_fraction`` hides under backward with overlap (the buckets' launches)."""
    prof, net = tr.c.profile, tr.c.net
    overlap = kind.endswith("-overlap")
    seconds = net.collective_seconds(nbytes, tr.group)
    if prof.allreduce_progress == "host":
        seconds *= prof.host_allreduce_factor
        return seconds * (1.0 - prof.host_hidden_fraction) if overlap else seconds
    if overlap:
        backward = 2 / 3 * tr.c.last_compute[tr.wr]
        seconds = max(seconds - backward, seconds / 8)
    return seconds


class VirtualAllreducer:
    """The gradient sum of the ``allreduce`` method: the whole flat buffer in MPICH's order, once
    every rank finished backward, at ``gradient_seconds``."""

    overlap = False                    # nothing to do during backward: no hook
    transport = "virtual"
    kind = "grad"                      # the cost kind (``gradient_seconds``)

    def __init__(self, net, flat, dist):
        self.net, self.flat, self.dist = net, flat, dist

    def ready(self, names) -> None:
        pass

    def close(self) -> None:
        """Nothing to free (the MPI transports' interface)."""

    def device_seconds(self, wait: bool = False) -> float:
        """Nothing runs on a device (the MPI transports' interface)."""
        return 0.0

    def progress(self) -> None:
        """Nothing in flight between ``ready`` and ``finish`` (the MPI transports' interface)."""

    def launch_all(self) -> None:
        """The sum starts in ``finish`` (the MPI transports' interface)."""

    def _sum(self, values: list) -> np.ndarray:
        return tree_sum(values)

    def finish(self) -> None:
        kind = self.kind + ("-overlap" if self.dist.overlap else "")
        total = self.net._collective(self.flat, self._sum, (kind, self.flat.nbytes),
                                     "in the gradient all-reduce")
        self.flat[...] = total
