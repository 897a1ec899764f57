"""What ``easgd`` and ``asgd`` share: ranks 0..K-1 are parameter-server shards (``--servers K``,
default 1), the other ranks are workers (``roles``: worker w is rank ``roles.worker_rank(w)``).

Shards: shard s holds elements ``bounds[s]:bounds[s+1]`` of the flat parameter buffer
(``wire.shard_bounds``: contiguous, equal bytes) and applies the method's rule to that slice
only; the update rules are element-wise, so the shards together apply exactly the unsharded rule
(bit for bit with one worker; with several, each shard serves pushes in its own arrival order).
Each shard keeps its own version, staleness statistics and ``told``/``fetched`` vectors.  K = 1 is
the one-server method of the papers.

Worker side: every ``period`` local steps (``tau`` / ``n_sync``) ``after_update`` does one exchange
(``comm/mpi/protocol.py``) with every shard at once: it pushes a payload built by the subclass (each
shard receives its slice) with the samples it consumed since its previous exchange, and receives
every shard's reply (server 0's header gives the global sample count, version, staleness and the
signals; each payload slice lands in place, then the subclass applies the whole payload).  Between
exchanges ``after_update`` returns the count of the last reply (0 before the first one): a worker
only learns the global count at exchanges.

Server side (``serve``): each shard serves pushes in arrival order (``MPI.ANY_SOURCE``, no
barrier), adds each push's samples to its count G and tells the sender G.  ``told[w]`` is the last
count told to worker w.  Server 0 decides the phases: a phase for boundary b (the collective every
worker enters once server 0 told it a count >= b) is entered only when ``min(told) >= b``: a worker
not yet told would still send an exchange, so entering the collective earlier could deadlock.
Before entering, server 0 sends every other shard a notice with each worker's exchange count; a
shard enters once it has served exactly those exchanges (each worker's last one before the phase
must be answered by every shard).  After the last boundary (= total) every worker has been told >=
total, has stopped, and has no message in flight; the servers return.

Evaluated model (``load_eval_model``, collective over all ranks): each shard's slice broadcast from
it (the center / master), with BN statistics averaged over the workers' communicator (the servers
train nothing).
"""
from __future__ import annotations

import abc
from collections import Counter

import numpy as np

from ..comm import watchdog
from ..comm.staging import HostStage
from ..comm.wire import PushHeader, ReplyHeader, Tag, header, shard_bounds
from ..io.trace import NO_TRACE, digest
from .base import Exchange, PhaseError, Traits


class ServerMethod(Exchange, metaclass=abc.ABCMeta):
    """Base of the parameter-server methods; subclasses fill in the hooks at the end.  On a server
    shard ``self.mine`` is its slice of ``ps.params`` (a view) and ``self.rx`` receives pushed
    slices; the hooks work on those."""

    # a resume onto other ranks: a worker starts from the center / master (momentum zero); a
    # server shard keeps its own
    traits = Traits(min_ranks=2, reshape_replica="center")
    kind = None                        # wire.Kind of the pushes

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        super().__init__(cfg, roles, comm, signals, trace)
        self.period = 1                # local steps between exchanges (subclass sets it)
        self.exchanges = 0             # worker: exchanges done; server: exchanges served
        self.version = 0               # server: updates applied; worker: version of the last reply
        self.staleness = Counter()     # histogram {staleness: updates applied} (worker: server 0's)
        self.last_staleness = 0
        self.rejected = 0              # pushes not applied (asgd --max-staleness): worker / server
        self._samples = self._steps = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        super().start(ps)              # everyone starts from rank 0's params and buffers
        r = self.roles
        self.bounds = shard_bounds(ps.params.size, r.num_servers)
        if r.is_server:
            lo, hi = self.bounds[r.shard], self.bounds[r.shard + 1]
            self.mine = ps.params[lo:hi]                  # this shard's slice (a view)
            self.rx = HostStage(self.mine.copy())         # a pushed slice (host side in rx.host)
            self.port = self.comm.server_port()
            self.told = np.zeros(r.num_workers, dtype=np.int64)
            self.told_sig = np.zeros((r.num_workers, 2), dtype=np.int64)
            self.fetched = np.zeros(r.num_workers, dtype=np.int64)   # version at last reply
            self.served = np.zeros(r.num_workers, dtype=np.int64)    # exchanges per worker
            self.target = np.zeros(r.num_workers, dtype=np.int64)    # shard > 0: a phase's notice
        else:
            self.rx = HostStage(ps.params.copy())         # the reply payload (host side in rx.host)
            self.port = self.comm.worker_port(r.server_ranks,
                                              self.bounds if r.num_servers > 1 else None)
            self.push_hdr = header(PushHeader.SIZE)
        self.start_role(ps)

    def close(self) -> None:
        if not self.roles.is_server and self.port.awaiting_reply:
            raise RuntimeError(f"{self.name}: worker closed with a reply still pending")

    # ------------------------------------------------------------------ worker
    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        self._samples += samples
        self._steps += 1
        if self._steps >= self.period:
            self._exchange(ps)
        return self.global_samples

    def _exchange(self, ps) -> None:
        h = self.push_hdr
        h[PushHeader.KIND], h[PushHeader.SAMPLES] = self.kind, self._samples
        h[PushHeader.STEPS], h[PushHeader.SEQ] = self._steps, self.exchanges
        h[PushHeader.STOP:PushHeader.CKPT + 1] = self.signals.raised
        payload = self.push_payload(ps)               # host array
        watchdog.doing(f"in exchange {self.exchanges} with the server")
        with self.timed("comm"):
            self.port.post_reply(self.reply_buffer(ps))
        with self.timed("wait"):
            self.port.send_push(h, payload)           # until every shard takes it: queueing
        with self.timed("comm"):
            self.port.finish_push()
        with self.timed("wait"):
            self.port.wait_reply_header()             # the shards applying it (and replying)
        with self.timed("comm"):
            r = self.port.wait_reply()                # the reply payloads arriving; server 0's
        self.global_samples = int(r[ReplyHeader.GLOBAL])
        self.version = int(r[ReplyHeader.VERSION])
        self.signals.merge(r[ReplyHeader.STOP:ReplyHeader.CKPT + 1])
        if len(self.port.replies) > 1:
            # a stop asked of shard s > 0 (SIGTERM/SIGUSR1 on its rank) reaches the workers only in
            # its replies, and only server 0 decides phases: relay it as this worker's own request
            # (into ``raised``, not ``seen``: entering a phase server 0 never enters would hang)
            stop = self.port.replies[1:, ReplyHeader.STOP].max()
            self.signals.raised[self.signals.STOP] = max(self.signals.raised[self.signals.STOP], stop)
        if r[ReplyHeader.REJECTED]:
            self.rejected += 1
        else:
            self._record(int(r[ReplyHeader.STALENESS]))
        self.exchanges += 1
        self._samples = self._steps = 0
        self.apply_reply(ps)

    def _record(self, stale: int) -> None:
        self.staleness[stale] += 1
        self.last_staleness = stale

    def staleness_summary(self) -> tuple[float, int]:
        """(mean, max) of the staleness histogram; (0, 0) before any exchange."""
        n = sum(self.staleness.values())
        if not n:
            return 0.0, 0
        return sum(k * v for k, v in self.staleness.items()) / n, max(self.staleness)

    def stats(self) -> dict:
        """Worker: exchanges so far, staleness of the last one and the mean; server: exchanges
        served, version, staleness mean/max, the histogram {staleness: exchanges}, and the seconds
        spent serving (receiving a push's payload, applying it, replying: ``service_seconds``) and
        waiting for the next push (``idle_seconds``), so service time per exchange and utilisation
        can be read off a run (docs/results.md, server contention)."""
        mean, top = self.staleness_summary()
        if self.roles.is_server:
            return dict(served=self.exchanges, version=self.version, staleness_mean=mean,
                        staleness_max=top, rejected=self.rejected,
                        service_seconds=self.timers["comm"], idle_seconds=self.timers["wait"],
                        staleness_histogram={str(k): v for k, v in sorted(self.staleness.items())})
        return dict(exchanges=self.exchanges, staleness=self.last_staleness, staleness_mean=mean,
                    rejected=self.rejected)

    # ------------------------------------------------------------------ server
    def serve(self, ps, phases) -> None:
        """Serves pushes until a phase ends the run.  Server 0, after each push, enters a phase if
        ``phases.due(min(told), signals every worker was told of)``: only what EVERY worker has been
        told counts, since entering earlier could deadlock (a worker not yet told would still push).
        It first sends the other shards each worker's exchange count; a shard enters once it has
        served exactly those."""
        port, first = self.port, self.roles.shard == 0
        notice = np.zeros(self.roles.num_workers, dtype=np.int64)
        waiting = False                                 # shard > 0: a notice is being served up to
        while True:
            if waiting and np.array_equal(self.served, self.target):
                waiting = False
                if phases.enter(self.global_samples):
                    return
                continue
            watchdog.doing(f"serving: waiting for a push (global sample {self.global_samples}, "
                           f"told {self.told.tolist()})")
            with self.timed("wait"):
                tag = port.next_message()               # idle until some worker pushes
            if tag == Tag.PHASE_NOTICE and not first:
                port.recv_notice(notice)
                self.target[...], waiting = notice, True
                continue
            self._serve_one(ps, port)
            if first and phases.due(int(self.told.min()), self.told_sig.min(axis=0)):
                for s in self.roles.server_ranks[1:]:
                    port.send_notice(s, self.served)
                if phases.enter(int(self.told.min())):
                    return

    def _serve_one(self, ps, port) -> None:
        """Receives one push (its header is next), applies it and replies."""
        sig = self.signals
        src = port.recv_push_header()
        with self.timed("comm"):
            port.recv_push_payload(src, self.rx.host)
        d = digest(self.rx.host) if self.trace.active else ""
        h = port.push_hdr
        if h[PushHeader.KIND] != self.kind:
            raise RuntimeError(f"{self.name} server: rank {src} pushed kind {int(h[0])}, "
                               f"expected {int(self.kind)} (mixed methods?)")
        w = self.roles.worker_of(src)
        stale = self.version - int(self.fetched[w])
        self.global_samples += int(h[PushHeader.SAMPLES])
        sig.merge(sig.raised)                           # the server's own clock / stop request
        sig.merge(h[PushHeader.STOP:PushHeader.CKPT + 1])
        with self.timed("comm"):
            applied = self.serve_push(ps, w, stale)     # applies and replies (subclass order)
        self.fetched[w] = self.version
        self.trace.record("serve", w=w, seq=int(h[PushHeader.SEQ]), version=self.version,
                          stale=stale, applied=int(applied), d=d)
        if applied:
            self._record(stale)
        else:
            self.rejected += 1
        self.exchanges += 1
        self.served[w] += 1
        self.told[w] = self.global_samples
        self.told_sig[w] = sig.seen

    def poll_in_phase(self) -> None:
        """Server, waiting in a phase agreement: every worker enters a phase right after the reply
        that told it of the phase, so a push arriving now means that worker will never join the
        agreement (inconsistent state, e.g. a checkpoint of another run): fail instead of hanging."""
        if not self.roles.is_server:
            return
        src = self.port.push_waiting()
        if src is not None:
            raise PhaseError(
                f"{self.name} server: worker rank {src} sent an exchange while the server waited for "
                f"every rank in a phase agreement (global sample {self.global_samples}, told "
                f"{self.told.tolist()}): this phase can never complete; "
                "the job's phase state is inconsistent (a checkpoint that does not fit this run?)")

    def reply(self, w: int, stale: int, payload: np.ndarray, version: int,
              rejected: bool = False) -> None:
        """Sends worker ``w`` the reply header (count, ``version``, ``stale``, whether its push was
        rejected) and ``payload``."""
        r = self.port.reply
        r[ReplyHeader.GLOBAL] = self.global_samples
        r[ReplyHeader.VERSION], r[ReplyHeader.STALENESS] = version, stale
        r[ReplyHeader.SERVED] = self.exchanges + 1
        r[ReplyHeader.STOP:ReplyHeader.CKPT + 1] = self.signals.seen
        r[ReplyHeader.REJECTED] = int(rejected)
        self.port.send_reply(self.roles.worker_rank(w), payload)

    # ------------------------------------------------------------------ evaluation
    def _gather_slices(self, ps, comm, root_of) -> None:
        """Every shard's slice of ``ps.params`` to every rank of ``comm`` (K broadcasts)."""
        for s in range(self.roles.num_servers):
            lo, hi = self.bounds[s], self.bounds[s + 1]
            comm.broadcast(ps.params[lo:hi], root_of(s))

    def load_eval_model(self, ps) -> dict:
        """Collective: the servers' weights to every rank, BN statistics = mean over the workers.

        Extra metrics: mean and max distance ||x_i - x_server|| over workers, and server 0's update
        count and the staleness over all shards (so that rank 0's summary records them)."""
        r, k = self.roles, self.roles.num_servers
        own = None if r.is_server else ps.params.copy()
        self._gather_slices(ps, self.comm, lambda s: s)
        if not r.is_server:                       # the servers' statistics were never trained
            r.workers.allreduce_mean(ps.buffers)
        # one small all-reduce: [distance of each worker..., per shard: version, staleness mean, max]
        p = r.num_workers
        vec = np.zeros(p + 3 * k)
        if own is None:
            vec[p + 3 * r.shard:p + 3 * r.shard + 3] = (self.version, *self.staleness_summary())
        else:
            vec[r.worker_index] = float(((own - ps.params) ** 2).sum()) ** 0.5
        vec = self.comm.allreduce_sum_host(vec)
        dist, shards = vec[:p], vec[p:].reshape(k, 3)
        return dict(worker_distance=float(dist.mean()), worker_distance_max=float(dist.max()),
                    server_version=int(shards[0, 0]), staleness_mean=float(shards[:, 1].mean()),
                    staleness_max=int(shards[:, 2].max()))

    # ------------------------------------------------------------------ checkpoints
    def quiesce(self, ps) -> None:
        """With several shards, every server's ``ps.params`` becomes the whole center / master, so
        that rank 0's checkpoint group is complete (a warm start reads rank 0's weights)."""
        if self.roles.is_server and self.roles.num_servers > 1:
            self._gather_slices(ps, self.roles.servers, lambda s: s)

    def state(self, ps) -> tuple[dict, dict]:
        """Inside a phase every exchange has been answered, so counters and buffers are consistent."""
        arrays, scalars = super().state(ps)
        scalars.update(exchanges=self.exchanges, version=self.version, samples=self._samples,
                       steps=self._steps, last_staleness=self.last_staleness, rejected=self.rejected,
                       staleness={str(k): v for k, v in self.staleness.items()})
        if self.roles.is_server:
            scalars.update(told=self.told.tolist(), fetched=self.fetched.tolist(),
                           served=self.served.tolist())
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        count = lambda key: int(scalars.get(key, 0))   # (a node group's member that now leads it
        self.exchanges, self.version = count("exchanges"), count("version")   # after its leader
        self._samples, self._steps = count("samples"), count("steps")         # died: a fresh
        self.last_staleness, self.rejected = count("last_staleness"), count("rejected")   # worker's)
        self.staleness = Counter({int(k): v for k, v in scalars.get("staleness", {}).items()})
        if self.roles.is_server and len(scalars["told"]) != self.roles.num_workers:
            # resumed with another worker count (resuming.origin): every worker starts from the
            # current center at the current count, as if it had just been told and replied to
            self.told[...] = self.global_samples
            self.fetched[...] = self.version
        elif self.roles.is_server:
            self.told[...] = scalars["told"]
            self.fetched[...] = scalars["fetched"]
            if "served" in scalars:                 # (checkpoints of one server: not needed)
                self.served[...] = scalars["served"]

    def adopt(self, ps, opt, origin) -> dict:
        """After a death a server serves the remaining workers as if each had just been told the
        agreed count and replied to (their own replicas go on; their per-worker counters start
        afresh).  After a reshape ``load_state`` did the same for another worker count."""
        out = super().adopt(ps, opt, origin)
        if origin.kind == "survive" and self.roles.is_server:
            self.told[...] = self.global_samples
            self.told_sig[...] = self.signals.seen
            self.fetched[...] = self.version
        return out

    # ------------------------------------------------------------------ subclass hooks
    def start_role(self, ps) -> None:
        """After the initial broadcast: allocate role-specific buffers."""

    @abc.abstractmethod
    def push_payload(self, ps) -> np.ndarray:
        """Worker: the host array to push (whole; each shard receives its slice)."""

    def reply_buffer(self, ps) -> np.ndarray:
        """Worker: the host array the reply payload is received into (each shard's slice)."""
        return self.rx.host

    @abc.abstractmethod
    def apply_reply(self, ps) -> None:
        """Worker: the reply payload has arrived (in ``reply_buffer``); update ``ps.params``."""

    @abc.abstractmethod
    def serve_push(self, ps, w: int, stale: int) -> bool:
        """Server shard: the pushed slice of worker ``w`` is in ``self.rx.host``; update
        ``self.mine``, bump ``self.version`` and call ``self.reply`` with this shard's slice (in
        the order the method defines).  Returns whether the push was applied."""
