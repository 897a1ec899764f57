"""``gossip``: decentralised asynchronous SGD (Jin et al. 2016), no server, no global barrier.

Every ``tau`` local steps (``dist.tau``) rank i takes the next peer j of its gossip graph
(``dist.gossip_graph``, ``mixing.GRAPHS``: ``uniform`` over all ranks, itself included unless
``--no-gossip-self``, seeded by ``train.seed`` and the rank, as the authors; ``exponential``,
rank + 2^k with k cycling; ``ring``, rank + 1) and exchanges with it by one of two strategies:

- **pull** (``--gossip pull``, ``PullGossip``): reads x_j's last published copy with one-sided
  ``Get`` (never waits for j), sets x_i <- (1 - gamma) x_i + gamma x_j (``dist.gossip_gamma``;
  picking itself: no mixing) and publishes its new x_i.  Only the puller changes.
- **push** (``--gossip push``, ``PushGossip``; push-sum / stochastic gradient push): the state is
  (w_i x_i, w_i) with de-biased x_i in ``ps.params`` (what gradients are computed on).  The
  optimizer's update of x_i is carried into the numerator because the numerator is always
  w_i * params after the local step.  Rank i sends half, ((w_i/2) x_i, w_i/2), with
  ``Accumulate(SUM)`` into j's inbox (x_i unchanged, w_i halves), then drains its own inbox
  atomically and folds it: x_i <- (w_i x_i + S)/(w_i + W), w_i <- w_i + W.  Picking itself:
  nothing is sent.

The global sample count lives in an int64 on rank 0 (``SampleCounter``: ``Fetch_and_op(SUM)``, added
once per exchange, with the signals max-merged beside it); between exchanges ``after_update``
returns the last total it fetched.  Evaluation averages the replicas exactly (the de-biased x_i for
push) and reports the consensus distance.  Momentum stays local.

Timers: ``wait`` is the counter update (two 8-byte atomics on rank 0) and the failed tries of a
pull read (the peer was publishing that copy); ``comm`` is the rest of the exchange (read, mix and
publish; or push, drain and fold).
"""
from __future__ import annotations

import numpy as np

from ..comm import collectives
from ..comm.window import Inbox, PublishedVector, SampleCounter
from . import mixing
from .base import Method


class Gossip(Method):
    """What pull and push share: the graph, the schedule, the counter, evaluation, checkpoints.
    A strategy fills in ``open_windows``, ``mix`` and (optionally) ``quiesce`` and the hooks
    ``strategy_state`` / ``load_strategy_state`` / ``strategy_stats``."""

    name = "gossip"

    @classmethod
    def select(cls, cfg):
        return {"pull": PullGossip, "push": PushGossip}[cfg.dist.gossip]

    def __init__(self, cfg, roles, comm, signals):
        super().__init__(cfg, roles, comm, signals)
        d = cfg.dist
        self.gamma, self.tau = d.gossip_gamma, d.tau
        self.graph = mixing.GRAPHS[d.gossip_graph](cfg.train.seed, roles.rank, roles.size,
                                                   d.gossip_self)
        self.counter = self.stage = None
        self.windows: list = []
        self.exchanges = 0
        self.last_peer = -1
        self._unreported = 0              # samples consumed since the last Fetch_and_op

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        """Identical replicas (base), then the windows (collective, once) and the first publication."""
        super().start(ps)
        self.stage = collectives.HostStage(ps.params)
        self.counter = SampleCounter(self.comm, root=0)
        self.windows = [self.counter, *self.open_windows(ps.params.size, ps.params.dtype)]
        self.comm.Barrier()                # every rank has published before anyone reads

    def close(self) -> None:
        """Collective: frees the windows (every RMA call was flushed when it returned)."""
        for w in self.windows:
            w.free()
        self.windows, self.counter = [], None

    # ------------------------------------------------------------------ training
    def after_update(self, step: int, ps, samples: int) -> int:
        self._unreported += samples
        if (step + 1) % self.tau:
            return self.global_samples
        waited = self.waited()
        with self.timed("comm"):
            self.exchange()
            self.global_samples, sig = self.counter.add(self._unreported, self.signals.raised)
            self.signals.merge(sig)
        waited = self.waited() - waited          # blocked, not moving data: comm -> wait
        self.timers["comm"] -= waited
        self.timers["wait"] += waited
        self._unreported = 0
        return self.global_samples

    def waited(self) -> float:
        """Seconds the windows were blocked on other ranks so far (``comm/window.py``): the counter
        updates, and the pull reads' failed tries (the peer was publishing)."""
        return sum(w.waited for w in self.windows)

    def exchange(self) -> None:
        """One gossip exchange on the current parameters (the host copy, for device arrays)."""
        j = self.graph.peer()
        x = self.stage.to_host()
        self.mix(x, j if j != self.roles.rank else None)
        self.stage.to_device()
        self.exchanges += 1
        self.last_peer = j

    def stats(self) -> dict:
        return {"gossip_exchanges": self.exchanges, "gossip_peer": self.last_peer,
                **self.strategy_stats()}

    # ------------------------------------------------------------------ checkpoints
    def state(self, ps) -> tuple[dict, dict]:
        arrays, scalars = super().state(ps)
        scalars.update(exchanges=self.exchanges, last_peer=self.last_peer,
                       unreported=self._unreported, graph=self.graph.state(), **self.strategy_state())
        if self.roles.rank == self.counter.root:    # the counter's true value (quiescent: exact)
            scalars["counter_total"] = self.counter.add(0)[0]
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        self.exchanges, self.last_peer = int(scalars["exchanges"]), int(scalars["last_peer"])
        self._unreported = int(scalars["unreported"])
        self.graph.load_state(scalars["graph"] if "graph" in scalars else scalars["rng"])
        if self.roles.rank == self.counter.root:
            self.counter.set(int(scalars["counter_total"]))
        self.load_strategy_state(scalars)
        self.comm.Barrier()                          # restored everywhere before anyone reads

    # ------------------------------------------------------------------ evaluation
    def load_eval_model(self, ps) -> dict:
        """Collective: the exact average of the replicas' (de-biased) parameters and of their BN
        statistics; extra metric ``consensus_distance`` = mean_i ||x_i - mean||.  Messages still in
        push inboxes are not part of the average (they are folded at the next exchange)."""
        own = ps.params.copy()
        collectives.allreduce_mean(self.comm, ps.params)
        own -= ps.params
        dist = float(getattr(ps, "xp", np).linalg.norm(own))
        total = collectives.allreduce_sum_host(self.comm, np.array([dist]))[0]
        collectives.allreduce_mean(self.comm, ps.buffers)
        return {"consensus_distance": total / self.roles.size}

    # ------------------------------------------------------------------ strategy hooks
    def open_windows(self, n: int, dtype) -> list:
        """Collective: allocates the strategy's windows for n-element vectors; returns them."""
        raise NotImplementedError

    def mix(self, x, peer: int | None) -> None:
        """One exchange on host vector ``x`` (in place) with ``peer`` (None: this rank drew itself)."""
        raise NotImplementedError

    def strategy_stats(self) -> dict:
        return {}

    def strategy_state(self) -> dict:
        return {}

    def load_strategy_state(self, scalars: dict) -> None:
        pass


class PullGossip(Gossip):
    """Reads the peer's published copy (``PublishedVector``: never waits, never torn), mixes,
    publishes its own."""

    def open_windows(self, n: int, dtype) -> list:
        self.pub = PublishedVector(self.comm, n, dtype)
        self.peer_buf = np.empty(n, dtype)
        self.retries = 0
        self.last_version = 0
        self.pub.publish(self.stage.to_host())
        return [self.pub]

    def mix(self, x, peer) -> None:
        if peer is not None:
            self.last_version, r = self.pub.read(peer, self.peer_buf)
            self.retries += r
            mixing.pull_mix(x, self.peer_buf, self.gamma)
        self.pub.publish(x)

    def strategy_stats(self) -> dict:
        return {"gossip_torn_retries": self.retries}

    def strategy_state(self) -> dict:
        return {"retries": self.retries}

    def load_strategy_state(self, scalars: dict) -> None:
        self.retries = int(scalars["retries"])
        self.pub.publish(self.stage.to_host())      # peers read the restored parameters


class PushGossip(Gossip):
    """Push-sum: sends half its (numerator, weight) into the peer's ``Inbox``, folds its own."""

    def open_windows(self, n: int, dtype) -> list:
        self.weight = 1.0
        self.inbox = Inbox(self.comm, n + 1, dtype)
        self.msg = np.empty(n + 1, dtype)
        self.recv = np.empty(n + 1, dtype)
        return [self.inbox]

    def mix(self, x, peer) -> None:
        if peer is not None:
            sent, self.weight = mixing.push_split(self.weight, x.dtype)
            self.inbox.push(peer, mixing.push_message(x, sent, self.msg))
        self.fold_inbox(x)

    def fold_inbox(self, x) -> None:
        """Drains this rank's inbox and folds it into (w_i x_i, w_i), in place on ``x``."""
        self.inbox.drain(self.recv)
        self.weight = mixing.push_fold(x, self.weight, self.recv)

    def quiesce(self, ps) -> None:
        """Inside a phase nobody pushes, and every push was flushed, so draining the inbox now
        folds every message in flight into (w_i x_i, w_i): nothing is lost or counted twice."""
        x = self.stage.to_host()
        self.fold_inbox(x)
        self.stage.to_device()

    def strategy_stats(self) -> dict:
        return {"pushsum_weight": self.weight}

    def strategy_state(self) -> dict:
        return {"weight": self.weight}

    def load_strategy_state(self, scalars: dict) -> None:
        self.weight = float(scalars["weight"])
