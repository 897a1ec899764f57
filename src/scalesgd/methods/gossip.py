"""``gossip``: decentralised asynchronous SGD (Jin et al. 2016), no server, no global barrier.

Every ``tau`` local steps (``dist.tau``) rank i picks a peer j (``mixing.choose_peer``: uniform over
all ranks, itself included unless ``--no-gossip-self``; seeded by ``train.seed`` and the rank) and

- **pull** (``--gossip pull``): reads x_j's last published copy with one-sided ``Get`` (never waits
  for j), sets x_i <- (1 - gamma) x_i + gamma x_j (``dist.gossip_gamma``; picking itself: no mixing)
  and publishes its new x_i.  Only the puller changes.
- **push** (``--gossip push``, push-sum / stochastic gradient push): the state is (w_i x_i, w_i) with
  de-biased x_i in ``ps.params`` (what gradients are computed on).  The optimizer's update of x_i is
  carried into the numerator because the numerator is always w_i * params after the local step.
  Rank i sends half, ((w_i/2) x_i, w_i/2), with ``Accumulate(SUM)`` into j's inbox (x_i unchanged,
  w_i halves), then drains its own inbox atomically and folds it: x_i <- (w_i x_i + S)/(w_i + W),
  w_i <- w_i + W.  Picking itself: nothing is sent.

The global sample count lives in an int64 on rank 0 (``Fetch_and_op(SUM)``, added once per exchange);
between exchanges ``after_update`` returns the last total it fetched.  Evaluation averages the replicas
exactly (the de-biased x_i for push) and reports the consensus distance.  Momentum stays local.

Timers: ``wait`` is the counter update (two 8-byte atomics on rank 0) and the failed tries of a
pull read (the peer was publishing that copy); ``comm`` is the rest of the exchange (read, mix and
publish; or push, drain and fold).
"""
from __future__ import annotations

import numpy as np

from ..comm import collectives
from ..comm.window import SampleCounter, Inbox, PublishedVector
from . import mixing
from .base import Method


class Gossip(Method):
    name = "gossip"
    uses_server = False

    def __init__(self, cfg, topo):
        super().__init__(cfg, topo)
        d = cfg.dist
        self.variant, self.gamma, self.tau = d.gossip, d.gossip_gamma, d.tau
        self.include_self = d.gossip_self
        self.rng = mixing.peer_rng(cfg.train.seed, topo.rank)
        self.pub = self.inbox = self.counter = None
        self.stage = None
        self.weight = 1.0
        self.exchanges = self.retries = 0
        self.last_peer = -1
        self.last_version = 0
        self._unreported = 0              # samples consumed since the last Fetch_and_op

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        """Identical replicas (base), then the windows (collective, once) and the first publication."""
        super().start(ps)
        self.stage = collectives.HostStage(ps.params)
        n, dt = ps.params.size, ps.params.dtype
        self.counter = SampleCounter(self.comm, root=0)
        if self.variant == "pull":
            self.pub = PublishedVector(self.comm, n, dt)
            self.peer_buf = np.empty(n, dt)
            self.pub.publish(self.stage.to_host())
        else:
            self.inbox = Inbox(self.comm, n + 1, dt)
            self.msg = np.empty(n + 1, dt)
            self.recv = np.empty(n + 1, dt)
        self.comm.Barrier()                # every rank has published before anyone reads

    def close(self) -> None:
        """Collective: frees the windows (every RMA call was flushed when it returned)."""
        for w in (self.pub, self.inbox, self.counter):
            if w is not None:
                w.free()
        self.pub = self.inbox = self.counter = None

    # ------------------------------------------------------------------ training
    def after_update(self, step: int, ps, samples: int) -> int:
        self._unreported += samples
        if (step + 1) % self.tau:
            return self.global_samples
        waited = self.waited()
        with self.timed("comm"):
            self.exchange()
            self.global_samples, sig = self.counter.add(self._unreported, self.raised)
            self.seen[:] = np.maximum(self.seen, sig)
        waited = self.waited() - waited          # blocked, not moving data: comm -> wait
        self.timers["comm"] -= waited
        self.timers["wait"] += waited
        self._unreported = 0
        return self.global_samples

    def waited(self) -> float:
        """Seconds the windows were blocked on other ranks so far (``comm/window.py``): the counter
        updates, and the pull reads' failed tries (the peer was publishing)."""
        return sum(w.waited for w in (self.pub, self.inbox, self.counter) if w is not None)

    def exchange(self) -> None:
        """One gossip exchange on the current parameters (the host copy, for device arrays)."""
        j = mixing.choose_peer(self.rng, self.topo.rank, self.topo.size, self.include_self)
        x = self.stage.to_host()
        if self.variant == "pull":
            if j != self.topo.rank:
                self.last_version, r = self.pub.read(j, self.peer_buf)
                self.retries += r
                mixing.pull_mix(x, self.peer_buf, self.gamma)
            self.pub.publish(x)
        else:
            if j != self.topo.rank:
                sent, self.weight = mixing.push_split(self.weight, x.dtype)
                self.inbox.push(j, mixing.push_message(x, sent, self.msg))
            self.fold_inbox(x)
        self.stage.to_device()
        self.exchanges += 1
        self.last_peer = j

    def fold_inbox(self, x) -> None:
        """Push only: drains this rank's inbox and folds it into (w_i x_i, w_i), in place on ``x``."""
        self.inbox.drain(self.recv)
        self.weight = mixing.push_fold(x, self.weight, self.recv)

    def stats(self) -> dict:
        out = {"gossip_exchanges": self.exchanges, "gossip_peer": self.last_peer}
        if self.variant == "pull":
            out["gossip_torn_retries"] = self.retries
        else:
            out["pushsum_weight"] = self.weight
        return out

    # ------------------------------------------------------------------ checkpoints
    def quiesce(self, ps) -> None:
        """Push: inside a phase nobody pushes, and every push was flushed, so draining the inbox
        now folds every message in flight into (w_i x_i, w_i): nothing is lost or counted twice."""
        if self.variant == "push":
            x = self.stage.to_host()
            self.fold_inbox(x)
            self.stage.to_device()

    def state(self, ps) -> tuple[dict, dict]:
        arrays, scalars = super().state(ps)
        scalars.update(weight=self.weight, exchanges=self.exchanges, retries=self.retries,
                       last_peer=self.last_peer, unreported=self._unreported,
                       rng=self.rng.bit_generator.state)
        if self.topo.rank == 0:                     # the counter's true value (quiescent: exact)
            scalars["counter_total"] = self.counter.add(0)[0]
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        self.weight, self.exchanges = float(scalars["weight"]), int(scalars["exchanges"])
        self.retries, self.last_peer = int(scalars["retries"]), int(scalars["last_peer"])
        self._unreported = int(scalars["unreported"])
        self.rng.bit_generator.state = scalars["rng"]
        if self.topo.rank == 0:
            self.counter.set(int(scalars["counter_total"]))
        if self.variant == "pull":
            self.pub.publish(self.stage.to_host())      # peers read the restored parameters
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
        return {"consensus_distance": total / self.topo.size}
