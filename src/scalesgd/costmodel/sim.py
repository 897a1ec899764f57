"""Discrete-event simulation of the methods' steps: stragglers, server queueing, NIC contention.

The analytic model (``cost.py``) gives means without variability; here every local step draws its
compute time (``Straggle``: a jitter on every worker, plus chosen workers that sleep U[0, max_delay]
after each step as in Jin et al.'s straggler hook), and the shared resources are FIFO queues:

* **allreduce**: a step ends when the slowest worker has computed, plus the all-reduce.
* **server** (easgd / asgd): after ``tau`` local steps a worker's exchange joins the server's queue
  (one exchange at a time, ``cost.server_service_seconds``); the worker waits for its reply.
  Staleness of an exchange = exchanges the server applied since this worker's previous one.
* **gossip**: after ``tau`` steps a worker pulls from (or pushes to) a uniformly random peer (itself
  included, as the authors' code: then nothing moves); the peer's NIC serves one transfer at a time.

Throughput is measured in steady state: from the first completion after ``warmup`` x the simulated
time until the first worker has done its ``steps`` (a slow worker does not stretch the window).
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from . import cost


@dataclass(frozen=True)
class Straggle:
    jitter_cv: float = 0.0        # every step: compute * max(0.5, 1 + cv * N(0, 1))
    stragglers: int = 0           # workers (the last ones) that also sleep U[0, max_delay] per step
    max_delay: float = 0.0        # seconds


@dataclass
class SimResult:
    samples_per_second: float
    step_seconds: float           # mean wall seconds per local step of one worker
    server_utilization: float = 0.0
    wait_mean: float = 0.0        # seconds an exchange waited in a queue (server or a peer's NIC)
    staleness: Counter = field(default_factory=Counter)
    exchanges: int = 0            # exchanges completed inside the measurement window
    rejected: int = 0             # of those, pushes rejected as too stale (max_staleness)
    useful_samples_per_second: float = 0.0     # samples of applied exchanges only

    @property
    def staleness_mean(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0


class _Draw:
    def __init__(self, p: int, w: cost.Work, st: Straggle, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tc, self.st = w.step_seconds, st
        self.slow = set(range(p - min(st.stragglers, p), p))

    def __call__(self, i: int, steps: int = 1) -> float:
        t = 0.0
        for _ in range(steps):
            f = max(0.5, 1.0 + self.st.jitter_cv * self.rng.standard_normal()) if self.st.jitter_cv else 1.0
            t += self.tc * f
            if i in self.slow and self.st.max_delay:
                t += self.rng.uniform(0.0, self.st.max_delay)
        return t


def simulate(method: str, p: int, w: cost.Work, net: cost.Net, steps: int = 400, tau: int = 1,
             variant: str = "pull", straggle: Straggle = Straggle(), seed: int = 0,
             warmup: float = 0.1, shards: int = 1, max_staleness: int | None = None,
             overlap: bool = False) -> SimResult:
    """Simulates ``steps`` local steps per worker (``p`` workers); see the module doc.  Server
    methods: ``shards`` (service per slice, ``cost.server_service_seconds``) and ``max_staleness``
    (a push staler than that is rejected: not applied, the version does not move); gossip:
    ``overlap`` (the exchange runs under the next step's compute)."""
    draw = _Draw(p, w, straggle, seed)
    if method in ("allreduce", "single"):
        comm = cost.allreduce_seconds(w.param_bytes, p, net) if method == "allreduce" else 0.0
        times = [max(draw(i) for i in range(p)) + comm for _ in range(steps)]
        skip = int(warmup * steps)
        span = float(np.sum(times[skip:]))
        rate = p * w.batch * (steps - skip) / span
        return SimResult(rate, span / (steps - skip), useful_samples_per_second=rate)
    if method in ("easgd", "asgd"):
        return _server(p, w, net, steps, tau, draw, warmup, shards, max_staleness)
    if method == "gossip":
        return _gossip(p, w, net, steps, tau, variant, draw, warmup, seed, overlap)
    raise ValueError(f"unknown method {method!r}")


def _window_rate(ends: list[float], t_stop: float, warmup: float, per_event: float) -> tuple[float, int]:
    """Samples per second over (t0, t_stop] from the completion times of the events (each worth
    ``per_event`` samples), t0 = the first completion after ``warmup * t_stop`` (so a periodic
    process is measured exactly); returns (rate, events counted)."""
    t0 = min(e for e in ends if e >= warmup * t_stop)      # start the window at an event
    n = sum(1 for e in ends if t0 < e <= t_stop)
    if n == 0 or t_stop <= t0:
        raise ValueError("simulation too short for a steady-state window: raise steps (or lower tau)")
    return n * per_event / (t_stop - t0), n


def _server(p, w, net, steps, tau, draw, warmup, shards=1, max_staleness=None) -> SimResult:
    """Runs until the first worker has done ``steps`` local steps (a slow worker must not stretch
    the window: the others keep going in a real run); throughput over the steady part.  K shards
    serve every exchange together (one queue, service per slice) and the worker's own link adds
    ``cost.worker_link_surplus`` to its exchange."""
    ts = cost.server_service_seconds(w.param_bytes, net, shards)
    extra = cost.worker_link_surplus(w.param_bytes, net, shards)
    rounds = max(1, steps // tau)
    heap = [(draw(i, tau), i) for i in range(p)]
    heapq.heapify(heap)
    free = 0.0
    version, fetched, done = 0, [0] * p, [0] * p
    log = []                                   # (arrival, start, end, staleness, applied) per exchange
    t_stop = None
    while heap:
        arrive, i = heapq.heappop(heap)
        start = max(arrive, free)
        free = start + ts
        stale = version - fetched[i]
        applied = max_staleness is None or stale <= max_staleness
        log.append((arrive, start, free, stale, applied))
        version += int(applied)
        fetched[i] = version
        done[i] += 1
        if done[i] == rounds:
            t_stop = free
            break
        heapq.heappush(heap, (free + extra + draw(i, tau), i))
    ends = [x[2] for x in log]
    rate, n = _window_rate(ends, t_stop, warmup, tau * w.batch)
    t0 = t_stop - n * tau * w.batch / rate
    inside = [x for x in log if t0 < x[2] <= t_stop]
    busy = sum(min(x[2], t_stop) - max(x[1], t0) for x in log if x[2] > t0 and x[1] < t_stop)
    stale = Counter(x[3] for x in inside if x[4])
    rejected = sum(1 for x in inside if not x[4])
    waited = float(np.mean([x[1] - x[0] for x in inside])) if inside else 0.0
    return SimResult(rate, p * w.batch / rate, busy / (t_stop - t0), waited, stale, n, rejected,
                     rate * (n - rejected) / n)


def _gossip(p, w, net, steps, tau, variant, draw, warmup, seed, overlap=False) -> SimResult:
    rng = np.random.default_rng([seed, 0x6055])
    S = w.param_bytes
    if variant == "pull":
        wire, local = cost.get_seconds(S, net), cost.mix_seconds(S, net)
    else:
        wire = net.alpha + net.accumulate_factor * S / net.bandwidth
        local = 2 * cost.mix_seconds(S, net)
    rounds = max(1, steps // tau)
    nic = [0.0] * p                  # when each node's NIC is next free to serve a transfer
    heap = [(draw(i, tau), i) for i in range(p)]
    heapq.heapify(heap)
    done = [0] * p
    log = []                         # (request, start, end) per exchange
    t_stop = None
    while heap:
        t, i = heapq.heappop(heap)
        j = int(rng.integers(p))
        if j == i:                    # picked itself: no transfer, no mixing
            start = end = t
        else:
            start = max(t, nic[j])
            nic[j] = start + wire
            end = nic[j] + local
        log.append((t, start, end))
        done[i] += 1
        if done[i] == rounds:
            t_stop = t        # every exchange ending by now has been simulated (requests come in order)
            break
        # blocking: the next step starts after the exchange; overlapped: right away, and it
        # ends (mixes) once both its compute and this exchange are done
        heapq.heappush(heap, (max(t + draw(i, tau), end) if overlap else end + draw(i, tau), i))
    rate, n = _window_rate([e for _, _, e in log], t_stop, warmup, tau * w.batch)
    t0 = t_stop - n * tau * w.batch / rate
    waits = [s - r for r, s, e in log if t0 < e <= t_stop]
    return SimResult(rate, p * w.batch / rate, 0.0, float(np.mean(waits)) if waits else 0.0, Counter(), n,
                     0, rate)
