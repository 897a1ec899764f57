"""What ``easgd`` and ``asgd`` share: rank 0 is a parameter server, ranks 1..p-1 are workers
(``roles``: worker w is rank ``roles.worker_rank(w)``).

Worker side: every ``period`` local steps (``tau`` / ``n_sync``) ``after_update`` does one exchange
(``comm/protocol.py``): it pushes a payload built by the subclass with the samples it consumed
since its previous exchange, and receives the server's reply (the global sample count, the server
version, the staleness of this exchange, and a parameter-sized payload the subclass applies).
Between exchanges ``after_update`` returns the count of the last reply (0 before the first one):
a worker only learns the global count at exchanges.

Server side (``serve``): serves pushes in arrival order (``MPI.ANY_SOURCE``, no barrier), adds
each push's samples to the global count G and tells the sender G.  ``told[w]`` is the last count
told to worker w.  A phase for boundary b (the collective every worker enters once it was told a
count >= b) is entered only when ``min(told) >= b``: a worker not yet told would still send an
exchange, so entering the collective earlier could deadlock.  After the last boundary
(= total) every worker has been told >= total, has stopped, and has no message in flight; the
server returns.

Evaluated model (``load_eval_model``, collective over all ranks): the server's weights broadcast
from the server, with BN statistics averaged over the workers' communicator (the server trains
nothing).
"""
from __future__ import annotations

import abc
from collections import Counter

import numpy as np

from ..comm import collectives, watchdog
from ..comm.collectives import HostStage
from ..comm.protocol import PushHeader, ReplyHeader, ServerPort, WorkerPort, header
from .base import Method, PhaseError


class ServerMethod(Method, metaclass=abc.ABCMeta):
    """Base of the parameter-server methods; subclasses fill in the five hooks at the end."""

    num_servers = 1
    min_ranks = 2
    kind = None                        # protocol.Kind of the pushes

    def __init__(self, cfg, roles, comm, signals):
        super().__init__(cfg, roles, comm, signals)
        self.period = 1                # local steps between exchanges (subclass sets it)
        self.exchanges = 0             # worker: exchanges done; server: exchanges served
        self.version = 0               # server: updates applied; worker: version of the last reply
        self.staleness = Counter()     # histogram {staleness: exchanges} (worker: its own)
        self.last_staleness = 0
        self._samples = self._steps = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        super().start(ps)              # everyone starts from rank 0's params and buffers
        self.rx = HostStage(ps.params.copy())      # payload receive buffer (host side in rx.host)
        r = self.roles
        if r.is_server:
            self.port = ServerPort(self.comm)
            self.poll_in_phase = self._push_during_phase
            self.told = np.zeros(r.num_workers, dtype=np.int64)
            self.told_sig = np.zeros((r.num_workers, 2), dtype=np.int64)
            self.fetched = np.zeros(r.num_workers, dtype=np.int64)   # version at last reply
        else:
            self.port = WorkerPort(self.comm, r.server)
            self.push_hdr = header(PushHeader.SIZE)
        self.start_role(ps)

    def close(self) -> None:
        if not self.roles.is_server and self.port.pending:
            raise RuntimeError(f"{self.name}: worker closed with a reply still pending")

    # ------------------------------------------------------------------ worker
    def after_update(self, step: int, ps, samples: int) -> int:
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
            self.port.push_header(h)                  # until the server takes it: queueing
        with self.timed("comm"):
            self.port.push_payload(payload)
        with self.timed("wait"):
            self.port.wait_reply_header()             # the server applying it (and replying)
        with self.timed("comm"):
            r = self.port.wait_reply()                # the reply's payload arriving
        self.global_samples = int(r[ReplyHeader.GLOBAL])
        self.version = int(r[ReplyHeader.VERSION])
        self.signals.merge(r[ReplyHeader.STOP:ReplyHeader.CKPT + 1])
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
        served, version, staleness mean/max and the histogram {staleness: exchanges}."""
        mean, top = self.staleness_summary()
        if self.roles.is_server:
            return dict(served=self.exchanges, version=self.version, staleness_mean=mean,
                        staleness_max=top,
                        staleness_histogram={str(k): v for k, v in sorted(self.staleness.items())})
        return dict(exchanges=self.exchanges, staleness=self.last_staleness, staleness_mean=mean)

    # ------------------------------------------------------------------ server
    def serve(self, ps, check) -> None:
        """Serves pushes until a phase ends the run.  After each push, ``check(min(told), signals
        every worker was told of)`` runs a phase if one is due (the collective a worker enters once
        told a count >= a new boundary or a new signal): only what EVERY worker has been told
        counts, since entering earlier could deadlock (a worker not yet told would still push)."""
        port, sig = self.port, self.signals
        while True:
            watchdog.doing(f"serving: waiting for a push (global sample {self.global_samples}, "
                           f"told {self.told.tolist()})")
            with self.timed("wait"):
                src = port.recv_push_header()           # idle until some worker pushes
            with self.timed("comm"):
                port.recv_push_payload(src, self.rx.host)
            h = port.push_hdr
            if h[PushHeader.KIND] != self.kind:
                raise RuntimeError(f"{self.name} server: rank {src} pushed kind {int(h[0])}, "
                                   f"expected {int(self.kind)} (mixed methods?)")
            w = self.roles.worker_of(src)
            stale = self.version - int(self.fetched[w])
            self.global_samples += int(h[PushHeader.SAMPLES])
            sig.merge(sig.raised)                       # the server's own clock / stop request
            sig.merge(h[PushHeader.STOP:PushHeader.CKPT + 1])
            with self.timed("comm"):
                self.serve_push(ps, w, stale)          # applies and replies (subclass order)
            self.fetched[w] = self.version
            self._record(stale)
            self.exchanges += 1
            self.told[w] = self.global_samples
            self.told_sig[w] = sig.seen
            if check(int(self.told.min()), self.told_sig.min(axis=0)):
                return

    def _push_during_phase(self) -> None:
        """Server, waiting in a phase agreement: every worker enters a phase right after the reply
        that told it of the phase, so a push arriving now means that worker will never join the
        agreement (inconsistent state, e.g. a checkpoint of another run): fail instead of hanging."""
        src = self.port.push_waiting()
        if src is not None:
            raise PhaseError(
                f"{self.name} server: worker rank {src} sent an exchange while the server waited for "
                f"every rank in a phase agreement (global sample {self.global_samples}, told "
                f"{self.told.tolist()}): this phase can never complete; "
                "the job's phase state is inconsistent (a checkpoint that does not fit this run?)")

    def reply(self, w: int, stale: int, payload: np.ndarray, version: int) -> None:
        """Sends worker ``w`` the reply header (count, ``version``, ``stale``) and ``payload``."""
        r = self.port.reply
        r[ReplyHeader.GLOBAL] = self.global_samples
        r[ReplyHeader.VERSION], r[ReplyHeader.STALENESS] = version, stale
        r[ReplyHeader.SERVED] = self.exchanges + 1
        r[ReplyHeader.STOP:ReplyHeader.CKPT + 1] = self.signals.seen
        self.port.send_reply(self.roles.worker_rank(w), payload)

    # ------------------------------------------------------------------ evaluation
    def load_eval_model(self, ps) -> dict:
        """Collective: server weights to every rank, BN statistics = mean over the workers.

        Extra metrics: mean and max distance ||x_i - x_server|| over workers, and the server's
        update count and staleness (so that rank 0's summary records them)."""
        r = self.roles
        own = None if r.is_server else ps.params.copy()
        collectives.bcast(self.comm, ps.params, r.server)
        if not r.is_server:                       # the server's statistics were never trained
            collectives.allreduce_mean(r.workers, ps.buffers)
        # one small all-reduce: [distance of each worker..., server's version, staleness mean, max]
        vec = np.zeros(r.num_workers + 3)
        if own is None:
            vec[r.num_workers:] = (self.version, *self.staleness_summary())
        else:
            vec[r.worker_index] = float(((own - ps.params) ** 2).sum()) ** 0.5
        vec = collectives.allreduce_sum_host(self.comm, vec)
        dist = vec[:r.num_workers]
        p = r.num_workers
        return dict(worker_distance=float(dist.mean()), worker_distance_max=float(dist.max()),
                    server_version=int(vec[p]), staleness_mean=float(vec[p + 1]),
                    staleness_max=int(vec[p + 2]))

    # ------------------------------------------------------------------ checkpoints
    def state(self, ps) -> tuple[dict, dict]:
        """Inside a phase every exchange has been answered, so counters and buffers are consistent."""
        arrays, scalars = super().state(ps)
        scalars.update(exchanges=self.exchanges, version=self.version, samples=self._samples,
                       steps=self._steps, last_staleness=self.last_staleness,
                       staleness={str(k): v for k, v in self.staleness.items()})
        if self.roles.is_server:
            scalars.update(told=self.told.tolist(), fetched=self.fetched.tolist())
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        self.exchanges, self.version = int(scalars["exchanges"]), int(scalars["version"])
        self._samples, self._steps = int(scalars["samples"]), int(scalars["steps"])
        self.last_staleness = int(scalars["last_staleness"])
        self.staleness = Counter({int(k): v for k, v in scalars["staleness"].items()})
        if self.roles.is_server:
            self.told[...] = scalars["told"]
            self.fetched[...] = scalars["fetched"]

    # ------------------------------------------------------------------ subclass hooks
    def start_role(self, ps) -> None:
        """After the initial broadcast: allocate role-specific buffers."""

    @abc.abstractmethod
    def push_payload(self, ps) -> np.ndarray:
        """Worker: the host array to push."""

    def reply_buffer(self, ps) -> np.ndarray:
        """Worker: the host array the reply payload is received into."""
        return self.rx.host

    @abc.abstractmethod
    def apply_reply(self, ps) -> None:
        """Worker: the reply payload has arrived (in ``reply_buffer``); update ``ps.params``."""

    @abc.abstractmethod
    def serve_push(self, ps, w: int, stale: int) -> None:
        """Server: the push of worker ``w`` is in ``self.rx.host``; update ``ps.params``, bump
        ``self.version`` and call ``self.reply`` (in the order the method defines)."""
