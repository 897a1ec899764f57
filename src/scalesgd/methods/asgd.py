"""``asgd``: Downpour-style asynchronous SGD as in GPU A-SGD (Paine et al. 2013).

The server ranks (``--servers K``: the first K ranks, each a contiguous slice) hold the master
weights w; the other ranks train.  Each worker runs ``n_sync`` local steps
(unchanged optimizer, momentum local) from its last fetched copy x_f, then pushes its accumulated
update  d_i = x_i - x_f  (the sum of its local updates) and fetches fresh weights in the same
exchange.  The server applies each push as it arrives and replies with the result::

    server:  w <- w + d_i ;  version += 1 ;  reply (w, version)
    worker:  x_i <- w ;  x_f <- w

Staleness of an update = server versions applied (by other workers) between this worker's
previous fetch and the application of its update; 0 with a single worker.

Bounded staleness (``--max-staleness S``, default -1: unbounded): a push whose staleness exceeds S
is **rejected** — not applied; the reply still carries the current w, which the worker takes as
usual, so its next update starts fresh.  The worker's samples still count (the data was read), its
update is dropped.  Rejecting rather than making fast workers wait (SSP) was chosen because a
waiting rule must never hold a push while the worker it waits for sits in a phase agreement (a
deadlock with the collective phases), and because a straggler's dropped update is what
backup-worker synchronous SGD drops too; the cost is the lost work, counted in ``rejected``.  With
``--servers K`` each shard applies the rule to its own staleness (a push may be applied on some
shards' slices only; every applied slice is within the bound).

Learning rate: w moves by the sum of the W workers' updates, so a single rank's rate is W times too
large; an unset ``schedule.lr`` is the base rate / W (``config.fit_to_world``, logged at start).
"""
from __future__ import annotations

import logging

from ..backend import get_array_module
from ..comm.staging import HostStage
from ..comm.wire import Kind
from ..io.trace import NO_TRACE
from .server import ServerMethod


class ASGD(ServerMethod):
    name = "asgd"
    kind = Kind.ASGD

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        super().__init__(cfg, roles, comm, signals, trace)
        self.period = cfg.dist.n_sync
        self.max_staleness = cfg.dist.max_staleness      # -1: unbounded

    def start_role(self, ps) -> None:
        # worker: receives the fetched w; server shard: its slice of w
        self.own = HostStage(self.mine if self.roles.is_server else ps.params)
        if not self.roles.is_server:
            self.base = HostStage(ps.params.copy())   # x_f, then the update d_i in place

    # worker --------------------------------------------------------------
    def push_payload(self, ps):
        d = self.base.arr
        d *= -1
        d += ps.params                           # d_i = x_i - x_f  (exact: -x_f + x_i)
        return self.base.to_host()

    def reply_buffer(self, ps):
        return self.own.host                     # the fetched w lands in ps.params (host side)

    def apply_reply(self, ps) -> None:
        self.own.to_device()                     # x_i <- w
        self.base.arr[...] = ps.params           # x_f <- w

    # server --------------------------------------------------------------
    def serve_push(self, ps, w: int, stale: int) -> bool:
        if 0 <= self.max_staleness < stale:      # too stale: not applied; the worker re-fetches
            self.reply(w, stale, self.own.to_host(), self.version, rejected=True)
            return False
        self.rx.to_device()
        self.mine += self.rx.arr                 # w <- w + d_i (this shard's slice)
        self.version += 1
        self.reply(w, stale, self.own.to_host(), self.version)
        return True

    # checkpoints: a worker's x_f (the weights of its last fetch) is state too
    def state(self, ps):
        arrays, scalars = super().state(ps)
        if not self.roles.is_server:
            arrays["fetched_weights"] = self.base.arr
        return arrays, scalars

    def load_state(self, ps, arrays, scalars):
        super().load_state(ps, arrays, scalars)
        if not self.roles.is_server:          # (a node group's new leader: its replica, as if fetched)
            xp = get_array_module(self.base.arr)
            self.base.arr[...] = xp.asarray(arrays["fetched_weights"]) if "fetched_weights" in arrays \
                else ps.params

    def adopt(self, ps, opt, origin) -> dict:
        """A reshape: a worker's last fetch is the master it starts from (``reshape_replica``); the
        first rank warns when the pushers changed, since the rate was set for the saved count."""
        out = super().adopt(ps, opt, origin)
        if origin.kind == "reshape" and not self.roles.is_server:
            self.base.arr[...] = ps.params
        before, now = origin.old_workers, self.roles.num_workers
        if origin.kind == "reshape" and self.roles.rank == 0 and before != now:
            who = "worker node group" if self.cfg.dist.hierarchy == "node" else "worker"
            lr = self.cfg.schedule.lr
            logging.getLogger("scalesgd").warning(
                "warning: asgd's server adds every %s's update, and schedule.lr = %g was set for %d "
                "%ss (saved in config.json): with %d the master moves %.2fx as far per round; --lr "
                "%.4g keeps its step (lr x %ss)", who, lr, before, who, now, now / before,
                lr * before / now, who)
        return out
