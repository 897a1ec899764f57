"""``gossip``: decentralised asynchronous SGD (Jin et al. 2016), no server, no global barrier.

Every ``tau`` local steps (``dist.tau``) rank i takes the next peer j of its gossip graph
(``dist.gossip_graph``, ``graphs.GRAPHS``: ``uniform`` over all ranks, itself included unless
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
  (whole messages, in turns: ``comm/mpi/inbox.py``) and folds it: x_i <- (w_i x_i + S)/(w_i + W),
  w_i <- w_i + W.  Picking itself: nothing is sent.

The global sample count lives in an int64 on rank 0 (``SampleCounter``: ``Fetch_and_op(SUM)``, added
once per exchange, with the signals max-merged beside it); between exchanges ``after_update``
returns the last total it fetched.  Evaluation averages the replicas exactly (the de-biased x_i for
push) and reports the consensus distance.  Momentum stays local.

Every exchange is the strategy's ``begin`` (the communication: pull reads the peer, push sends
half) then its ``finish`` (the effect: pull mixes the copy and publishes, push drains and folds),
plus the counter update; an *exchanger* decides when the communication runs.  ``Blocking`` runs it
at once, on this thread.  ``Overlapped`` (``dist.gossip_overlap``, overlapped SGP) hands it to a
communication thread (``comm.mpi.window.Courier``) after the local step and completes it before the
next mix, so it runs under the next step's compute.  Exchange e: collect what e-1 started (its counter
update: the global count, one exchange old; pull: x_j's copy, one exchange older), pull: mix it in
and publish; push: drain and fold; then start e's part on the courier (pull: read e's peer; push:
send half to e's peer) followed by the counter update.  A push or a counter update may still be on
its way to its target after the courier returned, so ``quiesce`` (before a checkpoint) collects,
flushes every window and waits for all ranks before anything is drained or read.  A checkpoint
records the peer of a read in flight; a resumed run reads it again.

Timers: ``wait`` is the counter update (two 8-byte atomics on rank 0) and the failed tries of a
pull read (the peer was publishing that copy); ``comm`` is the rest of the exchange (read, mix and
publish; or push, drain and fold).  With overlap nothing of it waits on this thread: ``comm`` is
what stayed on it (waiting for the courier, mixing, publishing, folding); stats
``gossip_background_seconds`` (the courier's work) and ``gossip_exposed_seconds`` (the part of it the
step waited for) give the fraction hidden, 1 - exposed / background.
"""
from __future__ import annotations

import abc
import functools
import logging

import numpy as np

from ..comm import progress
from ..comm.staging import HostStage
from ..comm.jobs import IDLE_POLL_SECONDS
from ..io.trace import NO_TRACE, digest
from . import graphs, mixing
from .base import Exchange, MethodError, Traits
from .exchangers import Blocking, Exchanger, Overlapped


class Gossip(Exchange, metaclass=abc.ABCMeta):
    """What pull and push share: the graph, the schedule, the counter, evaluation, checkpoints.  A
    strategy fills in ``open_windows``, ``begin`` (the communication), ``land`` (its result, once
    complete), ``finish`` (its effect), optionally ``quiesce``, and its share of the checkpoint
    (``strategy_state`` / ``load_strategy_state``) and of the stats (``strategy_stats``).  The
    exchanger (``Blocking`` / ``Overlapped``) decides when the communication runs."""

    name = "gossip"
    traits = Traits(reshape_replica="average")   # a resume onto other ranks: every rank from the average

    @classmethod
    def select(cls, cfg):
        return {"pull": PullGossip, "push": PushGossip}[cfg.dist.gossip]

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        super().__init__(cfg, roles, comm, signals, trace)
        d = cfg.dist
        self.gamma, self.tau = d.gossip_gamma, d.tau
        self.graph = graphs.GRAPHS[d.gossip_graph](cfg.train.seed, roles.rank, roles.size,
                                                   d.gossip_self)
        self.counter = self.stage = None
        self.exchanger: Exchanger = Blocking(self)
        self.windows: list = []
        self.exchanges = 0
        self.last_peer = -1
        self._unreported = 0              # samples consumed since the last Fetch_and_op
        self.abandoned = False            # a rank died: the windows are never used again
        if d.gossip_overlap and comm.thread_level() != "multiple":
            raise MethodError(f"dist.gossip_overlap needs MPI thread level 'multiple' (its exchange "
                              f"runs in a thread), but MPI was started with '{comm.thread_level()}' (see "
                              "MPI4PY_RC_THREAD_LEVEL, or the MPI library's thread support): drop "
                              "--gossip-overlap or start MPI with MPI_THREAD_MULTIPLE")
        # what answers the others' one-sided calls while this rank computes (comm/progress.py)
        self.progress_plan = progress.plan(d.mpi_progress, d.mpi_progress_ms, IDLE_POLL_SECONDS,
                                           one_sided=True, spans_nodes=comm.spans_nodes,
                                           overlap=d.gossip_overlap, thread_level=comm.thread_level())
        self.pump = progress.NoProgress()
        if roles.rank == 0:
            log = logging.getLogger("scalesgd")
            if self.progress_plan.warning:
                log.warning("warning: %s", self.progress_plan.warning)
            elif comm.spans_nodes or self.progress_plan.mechanism not in ("none", "courier"):
                log.info("gossip: MPI progress: %s", self.progress_plan.describe())

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        """Identical replicas (base), then the windows (collective, once) and the first publication."""
        super().start(ps)
        self.stage = HostStage(ps.params)
        self.counter = self.comm.sample_counter(root=0)
        self.windows = [self.counter, *self.open_windows(ps.params.size, ps.params.dtype)]
        if self.cfg.dist.gossip_overlap:         # idle, its courier keeps this rank's MPI progressing
            self.exchanger = Overlapped(self, self.comm.courier())
        else:
            self.pump = self.comm.keep_progressing(self.progress_plan)
        self.comm.barrier()                # every rank has published before anyone reads

    def close(self) -> None:
        """Collective: completes the exchange in flight, then frees the windows (``Win.Free``
        flushes what a courier's push left in flight)."""
        self.exchanger.close()            # its calls complete: a rank waiting here still polls MPI
        self.exchanger = Blocking(self)
        self.pump.close()                 # (Win.Free below is collective: MPI progresses in it)
        if self.pump.error is not None and self.roles.rank == 0:
            logging.getLogger("scalesgd").warning("warning: the MPI progress thread stopped early: %s",
                                                  self.pump.error)
        self.pump = progress.NoProgress()
        for w in self.windows:
            w.free()
        self.windows, self.counter = [], None

    # ------------------------------------------------------------------ training
    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        self._unreported += samples
        if (step + 1) % self.tau:
            return self.global_samples
        waited = self.exchanger.waited()
        with self.timed("comm"):
            j = self.graph.peer()
            x = self.stage.to_host()
            try:
                self.exchanger.exchange(x, j if j != self.roles.rank else None, self._unreported)
            finally:                      # (what was folded into x stays, even if a call fails)
                self.stage.to_device()
            self.exchanges += 1
            self.last_peer = j
        waited = self.exchanger.waited() - waited     # blocked, not moving data: comm -> wait
        self.timers["comm"] -= waited
        self.timers["wait"] += waited
        self._unreported = 0
        return self.global_samples

    def counted(self, total: int, sig, samples: int, x: int) -> None:
        """The counter update of exchange ``x`` returned ``total`` (after adding ``samples``) and the
        signals ``sig``: the count never goes back (an overlapped update lands one exchange late)."""
        if samples:                              # (a resumed read in flight adds nothing)
            self.trace.record("count", x=x, old=total - samples, add=samples)
        self.global_samples = max(self.global_samples, total)
        self.signals.merge(sig)

    def quiesce(self, ps) -> None:
        """Collective, inside a phase (nobody starts an exchange): afterwards every rank's exchange
        has landed (``Exchanger.quiesce``), so a checkpoint reads the counter and the inboxes whole."""
        self.exchanger.quiesce()

    def stats(self) -> dict:
        return {"gossip_exchanges": self.exchanges, "gossip_peer": self.last_peer,
                **self.exchanger.stats(), **self.strategy_stats()}

    # ------------------------------------------------------------------ checkpoints
    def state(self, ps) -> tuple[dict, dict]:
        arrays, scalars = super().state(ps)
        scalars.update(exchanges=self.exchanges, last_peer=self.last_peer,
                       unreported=self._unreported, graph=self.graph.state(), **self.exchanger.state())
        s_arrays, s_scalars = self.strategy_state()
        arrays.update(s_arrays)
        scalars.update(s_scalars)
        if self.roles.rank == self.counter.root and not self.abandoned:   # the counter's true
            scalars["counter_total"] = self.counter.add(0)[0]     # value (quiescent: exact)
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        self.exchanges, self.last_peer = int(scalars["exchanges"]), int(scalars["last_peer"])
        self._unreported = int(scalars["unreported"])
        self.graph.load_state(scalars["graph"] if "graph" in scalars else scalars["rng"])
        if self.roles.rank == self.counter.root:
            self.counter.set(int(scalars["counter_total"]))
        self.load_strategy_state(arrays, scalars)
        self.comm.barrier()                          # restored everywhere before anyone reads
        self.exchanger.load_state(scalars)

    def adopt(self, ps, opt, origin) -> dict:
        """Collective.  The same ranks resume their own state (``load_state``).  Otherwise the
        exchange partners changed: the replica goes on (a reshape: the saved replicas' average,
        de-biased, ``reshape_replica``) at the origin's count, which the new counter's root starts
        from, under the new job's graph, keeping the timers of the state it continues.  After a
        reshape every rank starts a fresh exchange history (push-sum weight 1, so the weights sum to
        p again: the mass is renormalised); a survivor keeps its counts, and push-sum renormalises
        the surviving weights (``moved_strategy``)."""
        if not origin.moved:
            return super().adopt(ps, opt, origin)
        origin.own.put(ps, opt)
        scalars = origin.own.method
        self.global_samples = int(origin.global_samples)
        self.timers.update(scalars["timers"])
        if origin.kind == "survive":      # (a node group's member that now leads has none: 0)
            self.exchanges = int(scalars.get("exchanges", 0))
            self._unreported = int(scalars.get("unreported", 0))
        if self.roles.rank == self.counter.root:
            self.counter.set(self.global_samples)
        out = self.moved_strategy(origin)
        self.comm.barrier()                          # set everywhere before anyone reads
        return out

    def moved_strategy(self, origin) -> dict:
        """Pull: publish the replica (both kinds); push-sum: renormalise after a death
        (``PushGossip``).  Returns what the failure's record should say."""
        return {}

    # ------------------------------------------------------------------ surviving a lost rank
    def abandon(self, ps) -> None:
        """Local: the exchange in flight is collected if its thread finished it (else dropped), the
        courier and the progress thread stop; push-sum folds what its inbox holds (its own memory)
        into ``ps``."""
        self.abandoned = True
        self.pump.close()
        self.pump = progress.NoProgress()
        ex = self.exchanger
        if isinstance(ex, Overlapped):
            try:
                ex.collect()
            except Exception:  # noqa: BLE001 - an exchange with the dead rank: its data is lost
                ex.in_flight_peer = None
            try:
                ex.close()                    # (the thread ends even when its last job failed)
            except Exception:  # noqa: BLE001
                pass
            self.exchanger = Blocking(self)

    # ------------------------------------------------------------------ evaluation
    def load_eval_model(self, ps) -> dict:
        """Collective: the exact average of the replicas' (de-biased) parameters and of their BN
        statistics; extra metric ``consensus_distance`` = mean_i ||x_i - mean||.  Messages still in
        push inboxes are not part of the average (they are folded at the next exchange)."""
        own = ps.params.copy()
        self.comm.allreduce_mean(ps.params)
        own -= ps.params
        dist = float(getattr(ps, "xp", np).linalg.norm(own))
        total = self.comm.allreduce_sum_host(np.array([dist]))[0]
        self.comm.allreduce_mean(ps.buffers)
        return {"consensus_distance": total / self.roles.size}

    # ------------------------------------------------------------------ strategy hooks
    @abc.abstractmethod
    def open_windows(self, n: int, dtype) -> list:
        """Collective: allocates the strategy's windows for n-element vectors; returns them."""

    @abc.abstractmethod
    def begin(self, x, peer: int | None, poll: float | None):
        """The communication of an exchange with ``peer`` from host vector ``x``, as a job to run
        (by this thread or a courier, which passes its ``poll``), or None: nothing to move (this
        rank drew itself).  ``x`` is None when a resumed run starts again the exchange that was in
        flight."""

    def land(self, got, x: int, peer: int | None) -> None:
        """The job of exchange ``x`` with ``peer`` completed with ``got`` (its return value)."""

    @abc.abstractmethod
    def finish(self, x) -> None:
        """The effect of the exchange that landed last on host vector ``x`` (in place)."""

    def strategy_stats(self) -> dict:
        return {}

    def strategy_state(self) -> tuple[dict, dict]:
        """This strategy's (arrays, scalars) for a checkpoint."""
        return {}, {}

    def load_strategy_state(self, arrays: dict, scalars: dict) -> None:
        pass


class PullGossip(Gossip):
    """Reads the peer's published copy (``PublishedVector``: never waits, never torn), mixes,
    publishes its own."""

    def open_windows(self, n: int, dtype) -> list:
        self.pub = self.comm.published_vector(n, dtype)
        self.peer_buf = np.empty(n, dtype)
        self.retries = 0
        self.last_version = 0
        self.landed = None                # (version, retries) of a read not mixed yet
        self.pub.publish(self.stage.to_host())
        return [self.pub]

    def begin(self, x, peer, poll):
        """Reads ``peer``'s copy into ``peer_buf`` (the job's until ``finish``)."""
        return None if peer is None else functools.partial(self.pub.read, peer, self.peer_buf, poll)

    def land(self, got, x, peer) -> None:
        self.landed = got
        if self.trace.active:               # (recorded when it has landed)
            self.trace.record("read", x=x, peer=peer, version=got[0], d=digest(self.peer_buf))

    def finish(self, x) -> None:
        """Mixes in the copy that landed (overlapped: one exchange older), publishes x."""
        if self.landed is not None:
            (self.last_version, r), self.landed = self.landed, None
            self.retries += r
            mixing.pull_mix(x, self.peer_buf, self.gamma)
        self.pub.publish(x)

    def strategy_stats(self) -> dict:
        return {"gossip_torn_retries": self.retries}

    def strategy_state(self) -> tuple[dict, dict]:
        """A read that ``quiesce`` collected (overlapped) is saved with its copy, so the resumed
        run mixes what the uninterrupted one would (reading the peer again would get its restored
        parameters, not the copy it had published)."""
        arrays, scalars = {}, {"retries": self.retries, "published": self.pub.published}
        if self.landed is not None:
            arrays["gossip_peer_copy"] = self.peer_buf.copy()
            scalars["landed"] = [int(v) for v in self.landed]
        return arrays, scalars

    def moved_strategy(self, origin) -> dict:
        self.pub.publish(self.stage.to_host())
        return {}

    def load_strategy_state(self, arrays: dict, scalars: dict) -> None:
        """Peers read the restored parameters, under the version number of the last publication
        before the checkpoint (so versions continue across a resume, as the trace records them)."""
        self.retries = int(scalars["retries"])
        self.pub.published = max(0, int(scalars.get("published", 1)) - 1)
        self.pub.publish(self.stage.to_host())
        if "landed" in scalars:
            self.peer_buf[...] = arrays["gossip_peer_copy"]
            self.landed = tuple(scalars["landed"])


class PushGossip(Gossip):
    """Push-sum: sends half its (numerator, weight) into the peer's ``Inbox``, folds its own.

    A message is n + 1 + p items: the numerator share, the weight share, then a count per sender
    (1 in the sender's slot), so a drain also says how many messages of each sender it folded.  A
    drain takes whole messages and knows their senders in the order they were added
    (``comm/mpi/inbox.py``); both are recorded in the trace: what a replay must fold in that drain, and
    in which order (the fold ignores the counts)."""

    def open_windows(self, n: int, dtype) -> list:
        self.weight = 1.0
        self.n, p = n, self.roles.size
        self.inbox = self.comm.inbox(n + 1 + p, dtype)
        self.inbox.check_alive = self._check_alive
        self.msg = np.zeros(n + 1 + p, dtype)
        self.msg[n + 1 + self.roles.rank] = 1
        self.recv = np.empty(n + 1 + p, dtype)
        self.drains = 0
        return [self.inbox]

    def begin(self, x, peer, poll):
        """Sends half of (w_i x_i, w_i) to ``peer`` (x_i is unchanged by the split)."""
        if peer is None or x is None:
            return None
        sent, self.weight = mixing.push_split(self.weight, x.dtype)
        self.trace.record("push", x=self.exchanges, peer=peer)
        return functools.partial(self.inbox.push, peer, mixing.push_message(x, sent, self.msg), poll)

    def _check_alive(self) -> None:
        """(The loop sets the signals' ``check_alive`` after the windows open.)"""
        if self.signals.check_alive is not None:
            self.signals.check_alive()

    def finish(self, x, locked: bool = True) -> None:
        """Drains this rank's inbox and folds it into (w_i x_i, w_i), in place on ``x`` (a push
        started earlier has left: ``msg`` is free again).  ``locked=False``: without waiting for a
        turn (``abandon``: a dead rank may hold one)."""
        order = self.inbox.drain(self.recv, locked)
        self.weight = mixing.push_fold(x, self.weight, self.recv)
        if self.trace.active:
            counts = self.recv[self.n + 1:]
            got = [[int(s), int(counts[s])] for s in np.flatnonzero(counts)]
            if order is None:
                self.trace.record("drain", k=self.drains, got=got)
            else:                      # (the senders in the order their messages were added)
                self.trace.record("drain", k=self.drains, got=got, order=order)
        self.drains += 1

    def quiesce(self, ps) -> None:
        """Collective, inside a phase: nobody starts a push, and every push has completed at its
        target (blocking: flushed when it returned; overlapped: ``Overlapped.quiesce``), so
        draining the inbox now folds every message in flight into (w_i x_i, w_i): nothing is lost
        or counted twice."""
        super().quiesce(ps)
        x = self.stage.to_host()
        self.finish(x)
        self.stage.to_device()

    def strategy_stats(self) -> dict:
        return {"pushsum_weight": self.weight}

    def abandon(self, ps) -> None:
        """Also folds the inbox: what survivors pushed here before the failure is kept."""
        super().abandon(ps)
        try:
            x = self.stage.to_host()
            self.finish(x, locked=False)
            self.stage.to_device()
        except Exception:  # noqa: BLE001 - (a window the library gave up on: its mass is lost)
            pass

    def moved_strategy(self, origin) -> dict:
        """After a reshape: weight 1, an empty inbox (nothing to do).  After a death, collective:
        the weights sum to the old rank count less what died with the rank (its own weight and what
        was pushed to it), and the survivors scale theirs to sum to the new count: the de-biased
        parameters x_i do not change, the average stays the weighted one."""
        if origin.kind != "survive":
            return {}
        scalars = origin.own.method      # (a node group's new leader, once a member: weight 1)
        self.weight = float(scalars.get("weight", 1.0))
        self.drains = int(scalars.get("drains", 0))
        total = float(self.comm.allreduce_sum_host(np.array([self.weight]))[0])
        lost = float(origin.old_size) - total
        self.weight *= self.roles.size / total
        return {"pushsum_weight_lost": lost, "pushsum_weight_kept": total}

    def strategy_state(self) -> tuple[dict, dict]:
        return {}, {"weight": self.weight, "drains": self.drains}

    def load_strategy_state(self, arrays: dict, scalars: dict) -> None:
        self.weight = float(scalars["weight"])
        self.drains = int(scalars.get("drains", 0))
