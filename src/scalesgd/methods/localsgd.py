"""``localsgd``: local SGD with periodic parameter averaging (Stich 2019; Lin et al. 2020, "Don't use
large mini-batches, use local SGD"), optionally with SlowMo's outer momentum (Wang et al. 2020).

Every worker trains its replica with the unchanged optimizer (its Nesterov momentum stays local) for
``tau`` local steps (``dist.tau``); then every replica's parameters and BN statistics are averaged
by one all-reduce, and all replicas continue from the average.  With ``dist.slowmo_beta`` = beta > 0
the average is one outer step with slow momentum u (SlowMo), with lr the inner learning rate of
that step and alpha = ``dist.slowmo_lr``::

    u       <- beta * u + (x_sync - x_avg) / lr      (x_sync: the parameters every replica started
    x_sync  <- x_sync - alpha * lr * u                this period from)
    every replica <- x_sync

beta = 0 and alpha = 1 give plain local SGD (x_sync = x_avg), which is also what runs without
SlowMo.  With tau = 1 and no SlowMo this is synchronous SGD in exact arithmetic: one local step is
linear in the gradient, momentum and weight decay included, so averaging the replicas after it
averages the updates (tests/mpi check both agree to rounding).  The BN statistics' running-average
update is linear too, so averaging them at every exchange gives what allreduce's average at
evaluation gives.

An exchange moves the whole flat buffer (allreduce moves the gradients every step), so the
communication per sample is 1/tau of allreduce's; the price is the replicas' drift within a period.
Global samples advance in lockstep (a synchronous method).  Between exchanges the replicas never
wait for each other: the stop and checkpoint requests (``Signals``) travel only with an exchange,
as the maximum taken just before the average (which is also its barrier), so every rank acts on a
request at the same step, at most tau - 1 steps after it was made.  (A per-step sum of them, as
the base class does, would make every step wait for the slowest worker: under noise or a
straggler that costs the slowest worker's delay per step, not per period.)  Timers: ``wait`` is
that maximum (until the slowest worker has finished its period), ``comm`` the all-reduces.
"""
from __future__ import annotations

from ..backend import get_array_module
from ..io.trace import NO_TRACE
from .base import Exchange, Traits


class LocalSGD(Exchange):
    name = "localsgd"
    # it averages when (step + 1) % tau == 0: the ranks' steps agree; a resume onto other ranks
    # starts every rank from the saved average
    traits = Traits(lockstep=True, reshape_replica="average")
                                     # (SlowMo's state is shared: the saved rank's it continues)

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        super().__init__(cfg, roles, comm, signals, trace)
        d = cfg.dist
        self.tau, self.beta, self.alpha = d.tau, d.slowmo_beta, d.slowmo_lr
        self.slowmo = self.beta > 0 or self.alpha != 1.0
        self.exchanges = 0               # averages so far
        self.u = self.x_sync = self.tmp = None   # SlowMo: slow momentum, outer iterate, scratch

    def start(self, ps) -> None:
        super().start(ps)                # identical replicas: x_sync = every replica's parameters
        if self.slowmo:
            xp = get_array_module(ps.params)
            self.x_sync = ps.params.copy()
            self.u, self.tmp = xp.zeros_like(ps.params), xp.empty_like(ps.params)

    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        """Every ``tau`` steps the average; no collective in between (see the module's doc)."""
        if self.roles.size == 1:
            self.merge_signals()
        elif (step + 1) % self.tau == 0:
            self.average(ps, lr)             # (its barrier merges the signals)
        return self.count(samples)

    def average(self, ps, lr: float) -> None:
        """Collective: the signals' maximum (the barrier), the replicas' average (params and BN
        statistics), then SlowMo's outer step."""
        with self.timed("wait"):
            self.merge_signals()
        with self.timed("comm"):
            self.comm.allreduce_mean(ps.params)
            self.comm.allreduce_mean(ps.buffers)
        if self.slowmo and lr > 0:
            x, u, t = self.x_sync, self.u, self.tmp
            t[...] = x
            t -= ps.params                   # x_sync - x_avg
            t *= 1.0 / lr
            u *= self.beta                   # u <- beta u + (x_sync - x_avg) / lr
            u += t
            t[...] = u
            t *= self.alpha * lr
            x -= t                           # x_sync <- x_sync - alpha lr u
            ps.params[...] = x
        self.exchanges += 1

    def load_eval_model(self, ps) -> dict:
        """The model evaluated is the replicas' average (what the next exchange would make)."""
        if self.roles.size > 1:
            self.comm.allreduce_mean(ps.params)
            self.comm.allreduce_mean(ps.buffers)
        return {}

    def state(self, ps) -> tuple[dict, dict]:
        arrays, scalars = super().state(ps)
        scalars["averages"] = self.exchanges
        if self.slowmo:
            arrays.update(slowmo_u=self.u, slowmo_x=self.x_sync)
        return arrays, scalars

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        super().load_state(ps, arrays, scalars)
        self.exchanges = int(scalars["averages"])
        if self.slowmo:
            self.u[...] = arrays["slowmo_u"]
            self.x_sync[...] = arrays["slowmo_x"]

    def stats(self) -> dict:
        return {"averages": self.exchanges}
