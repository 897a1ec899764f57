"""Gossip graphs: who a rank exchanges with at each exchange (``dist.gossip_graph``).

Pure: no communication, no arrays; a graph's state goes into the checkpoint.
"""
from __future__ import annotations

import abc

from .mixing import choose_peer, peer_rng


class UniformGraph:
    """Who a rank gossips with: at every exchange a peer uniform over all ranks (the authors'
    choice, self included unless ``include_self`` is False), from ``peer_rng(seed, rank)``.

    A gossip *graph* is anything with ``peer() -> int`` (the next exchange's peer) and a JSON-able
    ``state`` / ``load_state`` for checkpoints; a new topology is a new class, not a new code path
    in the method (``GRAPHS`` maps ``dist.gossip_graph`` to the class)."""

    def __init__(self, seed: int, rank: int, size: int, include_self: bool = True):
        self.rank, self.size, self.include_self = rank, size, include_self
        self.rng = peer_rng(seed, rank)

    def peer(self) -> int:
        return choose_peer(self.rng, self.rank, self.size, self.include_self)

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


class _Scheduled(abc.ABC):
    """A deterministic graph: exchange k's peer is ``rank + offset(k)``; the state is k."""

    def __init__(self, seed: int, rank: int, size: int, include_self: bool = True):
        self.rank, self.size, self.k = rank, size, 0

    @abc.abstractmethod
    def offset(self, k: int) -> int:
        """How far ahead of this rank exchange ``k``'s peer is."""

    def peer(self) -> int:
        j = (self.rank + self.offset(self.k)) % self.size
        self.k += 1
        return j

    def state(self) -> dict:
        return {"k": self.k}

    def load_state(self, state: dict) -> None:
        self.k = int(state["k"])


class ExponentialGraph(_Scheduled):
    """Time-varying one-peer exponential graph (as in Stochastic Gradient Push): exchange k goes
    to rank + 2^(k mod m), m = ceil(log2 size).  With pull and gamma = 1/2 in synchronous rounds,
    m rounds average p = 2^m replicas exactly."""

    def __init__(self, seed: int, rank: int, size: int, include_self: bool = True):
        super().__init__(seed, rank, size, include_self)
        self.m = max(1, (size - 1).bit_length())          # ceil(log2 size) for size >= 2

    def offset(self, k: int) -> int:
        return 1 << (k % self.m)


class RingGraph(_Scheduled):
    """Directed ring: every exchange goes to rank + 1 (the slowest-mixing graph; a baseline)."""

    def offset(self, k: int) -> int:
        return 1


GRAPHS = {"uniform": UniformGraph, "exponential": ExponentialGraph, "ring": RingGraph}
