"""``easgd``: asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015), with a
dedicated server rank as in Jin et al. 2016 (who served the center from a thread on rank 0).

The server ranks (``--servers K``: K shards, the first K ranks) hold the center x~, each shard a
contiguous slice of it; the other ranks are workers training replicas x_i with the unchanged
optimizer (Nesterov momentum stays local).  Every ``tau`` local steps worker i pushes x_i and
receives x~ as it was *before* the server applied this exchange; both sides then apply the same
elastic step with alpha = beta / (the number of workers) and e = alpha (x_i - x~)::

    worker:  x_i <- x_i - e        server:  x~ <- x~ + e

so x_i + x~ is conserved by every exchange (up to rounding).  The server serves pushes in arrival
order, no barrier.  Version = center updates applied; the staleness of an exchange = center
updates by other workers since this worker's previous exchange.
"""
from __future__ import annotations

from ..comm.staging import HostStage
from ..comm.wire import Kind
from ..io.trace import NO_TRACE
from .server import ServerMethod


class EASGD(ServerMethod):
    name = "easgd"
    kind = Kind.EASGD

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        super().__init__(cfg, roles, comm, signals, trace)
        self.period = cfg.dist.tau
        self.alpha = cfg.dist.beta / self.roles.num_workers

    def start_role(self, ps) -> None:
        # the worker's x_i / the server shard's slice of x~, host side
        self.own = HostStage(self.mine if self.roles.is_server else ps.params)

    # worker --------------------------------------------------------------
    def push_payload(self, ps):
        return self.own.to_host()

    def apply_reply(self, ps) -> None:
        """x_i <- x_i - alpha (x_i - x~), with x~ in ``rx``; in place, no temporaries."""
        self.rx.to_device()
        c = self.rx.arr
        c -= ps.params                           # x~ - x_i
        c *= self.alpha                          # -e
        ps.params += c

    # server --------------------------------------------------------------
    def serve_push(self, ps, w: int, stale: int) -> bool:
        """Replies with x~ first, then x~ <- x~ + alpha (x_i - x~), with x_i in ``rx`` (this
        shard's slices of both)."""
        self.reply(w, stale, self.own.to_host(), self.version + 1)
        self.rx.to_device()
        x = self.rx.arr
        x -= self.mine                           # x_i - x~
        x *= self.alpha                          # e
        self.mine += x
        self.version += 1
        return True
