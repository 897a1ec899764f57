"""Analytic cost model of one training step for each method (the formulas; ``sim.py`` simulates).
The network's closed forms (a transfer, the ring all-reduce, an element-wise pass) are
``scalesgd.netmodel``'s, the same the virtual cluster times its messages with.

Units: seconds and bytes.  A ``Net`` is a link (latency ``alpha``, bandwidth ``bandwidth``) plus the
memory bandwidth ``mem`` that element-wise passes over the parameter vector run at (mixing, applying
an update); a ``Work`` is one worker's step: compute seconds per minibatch, batch, parameter bytes.

* **allreduce** (ring / reduce-scatter + all-gather, the large-message algorithm of MPI and NCCL):
  ``2 (p - 1) alpha + 2 (p - 1) / p * S / B``, once per step, after the slowest worker's compute.
* **server** (easgd, asgd; one dedicated server that serves exchanges one at a time, as
  ``methods/server.py`` does): service time ``t_s = 2 (alpha + S / B) + 3 S / mem`` (receive S,
  apply, send S).  Workers cycle through ``tau`` local steps (think time Z = tau * t_c) and one
  exchange: a closed queueing network with one queue, solved exactly by mean-value analysis
  (``server_throughput``).  Saturation: ``p* = (Z + t_s) / t_s`` workers.
* **gossip pull**: one one-sided Get of S from one random peer plus a mixing pass per exchange:
  ``alpha + S / B + 3 S / mem``; every node serves on average one Get per exchange round whatever
  p is, so the per-step cost does not grow with p (contention is in ``sim.py``).
* **gossip push**: one Accumulate of S + 1 into the peer's inbox and one fold of the own inbox
  (the two round trips of a few bytes that take and pass on its turn there, ``comm/mpi/inbox.py``,
  are left out: microseconds against S / B).

The extensions:

* **K server shards** (``--servers K``): shard s holds S/K bytes and serves its slice of every
  exchange, ``t_s(K) = 2 (alpha + S / (K B)) + 3 S / (K mem)``; the shards are K queues that every
  exchange visits at once, modelled as one queue with service t_s(K).  The worker still moves S each
  way over its own link: the part of ``2 S / B`` the shards do not cover, ``2 S / B (1 - 1/K)``,
  is added to its think time.  Saturation rises to ``p* = (Z + t_s(K)) / t_s(K)``.
* **bounded staleness** (asgd ``--max-staleness``) does not change the time per exchange; a push
  more than S versions stale is rejected, so the useful samples are the applied ones
  (``sim.py`` counts them: staleness is a property of the arrival order, not of the means).
* **overlapped gossip** (``--gossip-overlap``): the exchange runs under the next step's compute and
  is waited for before the next mix, so a step costs ``max(t_c, exchange)`` instead of the sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..netmodel import element_pass_seconds, ring_allreduce_seconds, transfer_seconds


@dataclass(frozen=True)
class Net:
    alpha: float                 # seconds per message
    bandwidth: float             # bytes per second per link direction
    mem: float = 20e9            # bytes per second of an element-wise pass (mixing, apply)
    accumulate_factor: float = 1.0   # Accumulate runs at bandwidth / factor (measured here: 2-3)


@dataclass(frozen=True)
class Work:
    name: str
    step_seconds: float          # compute of one minibatch (forward + backward + update)
    batch: int
    param_bytes: float


def allreduce_seconds(nbytes: float, p: int, net: Net) -> float:
    return ring_allreduce_seconds(nbytes, p, net.bandwidth, net.alpha)


def get_seconds(nbytes: float, net: Net) -> float:
    return transfer_seconds(nbytes, net.bandwidth, net.alpha)


def mix_seconds(nbytes: float, net: Net) -> float:
    """One element-wise pass reading two vectors and writing one."""
    return element_pass_seconds(nbytes, net.mem)


def server_service_seconds(nbytes: float, net: Net, shards: int = 1) -> float:
    """Receive the worker's vector, apply it, send the result back (one exchange, sequential); with
    ``shards`` servers, the time each shard spends on its slice."""
    return 2 * get_seconds(nbytes / shards, net) + mix_seconds(nbytes / shards, net)


def worker_link_surplus(nbytes: float, net: Net, shards: int = 1) -> float:
    """Seconds of a sharded exchange spent on the worker's own link beyond what a shard spends on
    its slice: the worker sends and receives all S, each shard S/K."""
    return 2 * nbytes / net.bandwidth * (1 - 1 / shards)


def gossip_exchange_seconds(nbytes: float, net: Net, variant: str = "pull") -> float:
    if variant == "pull":
        return get_seconds(nbytes, net) + mix_seconds(nbytes, net)
    return net.alpha + net.accumulate_factor * nbytes / net.bandwidth + 2 * mix_seconds(nbytes, net)


def server_throughput(workers: int, think: float, service: float) -> tuple[float, float]:
    """Exact mean-value analysis of a closed network: ``workers`` customers alternate a delay
    station (``think`` seconds) and one FIFO queue (``service`` seconds, exponential service
    assumed by MVA; ``sim.py`` simulates the deterministic case).  Returns (exchanges per second,
    mean time an exchange spends at the server, queueing included)."""
    q = 0.0
    x = r = 0.0
    for n in range(1, workers + 1):
        r = service * (1.0 + q)
        x = n / (think + r)
        q = x * r
    return x, r


def saturation_workers(think: float, service: float) -> float:
    """Workers at which the server is busy all the time (asymptotic bound): (Z + t_s) / t_s."""
    return (think + service) / service


def tau_to_keep_up(workers: int, step: float, service: float) -> int:
    """Smallest tau (local steps between exchanges) with saturation_workers >= workers:
    tau >= (p - 1) t_s / t_c."""
    return max(1, math.ceil((workers - 1) * service / step - 1e-9))


def step_seconds(method: str, p: int, w: Work, net: Net, tau: int = 1, variant: str = "pull",
                 shards: int = 1, overlap: bool = False) -> dict:
    """Mean seconds per local step of one worker, with ``p`` workers and no stragglers, and what
    it is made of: {"step", "compute", "comm", "samples_per_second", "server_utilization"?}.
    ``shards``: server shards (easgd/asgd); ``overlap``: gossip's exchange under the compute."""
    S, tc = w.param_bytes, w.step_seconds
    if method in ("single",) or p == 1 and method == "allreduce":
        comm = 0.0
    elif method == "allreduce":
        comm = allreduce_seconds(S, p, net)
    elif method == "gossip":                 # a rank picks itself with probability 1/p: no transfer
        comm = (1 - 1 / p) * gossip_exchange_seconds(S, net, variant) / tau
    elif method in ("easgd", "asgd"):
        ts = server_service_seconds(S, net, shards)
        think = tau * tc + worker_link_surplus(S, net, shards)
        x, r = server_throughput(p, think, ts)
        cycle = p / x                                  # seconds per tau local steps of one worker
        return dict(step=cycle / tau, compute=tc, comm=(cycle - tau * tc) / tau,
                    samples_per_second=x * tau * w.batch, server_utilization=min(1.0, x * ts),
                    service=ts, saturation_workers=saturation_workers(think, ts))
    else:
        raise ValueError(f"unknown method {method!r}")
    if overlap and method == "gossip":       # hidden under the compute, up to the compute's length
        return dict(step=max(tc, comm), compute=tc, comm=max(0.0, comm - tc),
                    samples_per_second=p * w.batch / max(tc, comm))
    step = tc + comm
    return dict(step=step, compute=tc, comm=comm, samples_per_second=p * w.batch / step)
