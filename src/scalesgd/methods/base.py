"""The base of every method's parameter exchange, and the traits every method declares.

A method is a few roles that compose (``roles.py``: the record ``Method`` and the four role
protocols).  An exchange (``Exchange``) is the role a worker runs after its local update, and the
state codec of its method: when, and with whom, it exchanges which flat buffer, and what of that
a checkpoint keeps.  The loop calls, per step of a worker::

    loss = train_step(model, x, y)                        # fills ps.grads, no communication
    diverged = m.gradients.after_backward(step, ps, finite)   # e.g. all-reduce of the gradients
    opt.step(ps.params, ps.grads, lr)
    gs = m.exchange.after_update(step, ps, n, lr)         # e.g. elastic / gossip averaging -> global samples

and on a server ``m.server.serve(ps, phases)`` instead.  Progress is counted in **global samples**
(all workers together), so epochs, the learning-rate schedule and stopping mean the same for every
method.  Everything else (the stop/checkpoint signals, phases, the loop) is the control plane
(``train/``); an exchange only carries the ``signals`` it is handed on its messages: it sends
``signals.raised`` (a server: ``signals.seen``) and ``merge``s what it receives.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..choices import servers_of
from ..errors import MethodError, PhaseError  # noqa: F401 - re-exported
from ..io.trace import NO_TRACE


@contextlib.contextmanager
def timed(timers: dict, key: str, clock):
    """Adds the time spent inside to ``timers[key]`` (``clock``: the transport's, virtual or real)."""
    t = clock()
    try:
        yield
    finally:
        timers[key] += clock() - t


@dataclass(frozen=True)
class Traits:
    """What the loop, the recovery from a lost rank and a resume read of a method: fixed per class
    (node groups: from the method they run), never set from outside."""

    min_ranks: int = 1               # the fewest ranks it runs on (servers come on top: check_ranks)
    replicas_identical: bool = False  # every replica holds the same weights after each step (allreduce)
    lockstep: bool = False           # when the collectives come depends on the step count (localsgd)
    check_after: str = "update"      # the step's hook after which the loop checks, once, for a dead
                                     # rank: the one after the step's last collective
    reshape_replica: str = "source"  # a resume onto other ranks starts each replica from the saved
                                     # rank it continues ("source"), the saved replicas' average
                                     # ("average") or, on a worker, the server's center ("center")
    sums_gradients: bool = False     # its gradient role all-reduces every step's gradients over the
                                     # job (allreduce; ``dist.hierarchy = node``: in two levels, comm/)
    node_agents: bool = True         # ``dist.hierarchy = node`` makes each node one agent of it


class Exchange:
    """The lockstep exchange (every rank a worker, global samples advance together: ``single``),
    and the base every method's exchange derives from.  Its state codec too: ``state``,
    ``load_state``, ``adopt``, ``quiesce``, ``abandon``."""

    name = "base"
    traits = Traits()
    exchanges = 0                  # exchanges so far (a worker's with its peers, servers or the
                                   # average; a server's served): what a fault injected on one counts

    @classmethod
    def select(cls, cfg) -> type:
        """The class that runs ``cfg`` (a family of strategies, e.g. gossip pull/push, picks one)."""
        return cls

    @classmethod
    def servers_for(cls, cfg) -> int:
        """Server ranks this method takes with ``cfg`` (``dist.servers`` for the server methods)."""
        return servers_of(cls.name, cfg.dist.servers)

    @classmethod
    def check_ranks(cls, size: int, cfg) -> None:
        """Raises MethodError when the method cannot run on ``size`` ranks (before any collective)."""
        k = cls.servers_for(cfg)
        need = max(cls.traits.min_ranks, k + 1) if k else cls.traits.min_ranks
        if size < need:
            roles = (" (a server and a worker)" if k == 1 else
                     f" ({k} server shards and a worker)") if k else ""
            raise MethodError(f"method '{cls.name}' needs at least {need} ranks{roles}, got {size}")

    def __init__(self, cfg, roles, comm, signals, trace=NO_TRACE):
        """``roles``: this rank's role; ``comm``: the job's transport (``comm/mpi/transport.py``: MPI,
        or the virtual cluster's in-process one); ``signals``: the ``train.control.Signals`` to
        carry on this method's messages; ``trace``: the run's event recorder (``io/trace.py``)."""
        self.check_ranks(roles.size, cfg)
        self.cfg, self.roles, self.comm, self.signals, self.trace = cfg, roles, comm, signals, trace
        self.global_samples = 0
        self.timers = {"comm": 0.0, "wait": 0.0}

    # ------------------------------------------------------------------ lifecycle
    def start(self, ps) -> None:
        """Makes every replica identical to rank 0's (params and BN statistics)."""
        if self.roles.size > 1:
            self.comm.broadcast(ps.params, 0)
            self.comm.broadcast(ps.buffers, 0)

    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        """Parameters were updated locally from ``samples`` samples at learning rate ``lr``; returns
        the global count.

        Synchronous methods advance in lockstep; a stop request anywhere is known everywhere after
        the same step (one tiny all-reduce per step; a rank that died inside it is noticed by the
        loop's check after this hook, before the result is used)."""
        self.merge_signals()
        return self.count(samples)

    def merge_signals(self) -> None:
        """Collective: every rank's stop and checkpoint requests, max-merged into ``signals.seen``."""
        raised = self.signals.raised
        if self.roles.size > 1:
            self.signals.merge_collective(self.comm.allreduce_max_host(raised))
        else:
            self.signals.merge(raised)

    def count(self, samples: int) -> int:
        """A lockstep step of ``samples`` per worker: the global count after it."""
        self.global_samples += samples * self.roles.num_workers
        return self.global_samples

    def quiesce(self, ps) -> None:
        """Collective, inside a phase (no exchange in flight): fold any pending incoming state into
        this rank's own (gossip push drains its inbox) so that ``ps`` is complete for a checkpoint."""

    def load_eval_model(self, ps) -> dict:
        """Collective: puts the model to evaluate into ``ps`` (own replica by default); may return
        extra metrics (e.g. the consensus distance).  The caller restores ``ps.params`` and
        ``ps.buffers`` afterwards, so this must not change method state that lives in ``ps``."""
        return {}

    def state(self, ps) -> tuple[dict, dict]:
        """(arrays, JSON scalars) of method state beyond ps/momentum, for a checkpoint."""
        return {}, {"global_samples": self.global_samples, "timers": dict(self.timers)}

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        """Restores what ``state`` returned (after ``start``: windows and ports exist)."""
        self.global_samples = int(scalars["global_samples"])
        self.timers.update(scalars["timers"])

    # ------------------------------------------------------------------ a change of the job's ranks
    def adopt(self, ps, opt, origin) -> dict:
        """Collective, after ``start``: this rank takes the state it continues when the job's ranks
        changed, ``origin`` (``train/rankstate.Origin``): a resume on the same ranks (kind "same":
        its own saved state), on other ranks ("reshape": a saved rank's, with the replica
        ``reshape_replica`` asks for) or on the survivors of a lost rank ("survive": its own
        state, all-reduce's replica rank 0's).  By default the replica, momentum and BN statistics
        go into ``ps`` and ``opt``, the method's state is ``load_state``'s, and the job's count is
        the origin's.  Returns what the failure's record should say (e.g. push-sum's lost weight)."""
        origin.own.put(ps, opt)
        self.load_state(ps, origin.own.arrays, origin.own.method)
        if origin.moved:
            self.global_samples = int(origin.global_samples)
        return {}

    def stats(self) -> dict:
        """Method-specific values for the per-step metrics (staleness, exchanges...)."""
        return {}

    def close(self) -> None:
        """Frees windows and other MPI objects; called once after training on every rank."""

    # ------------------------------------------------------------------ surviving a lost rank
    def abandon(self, ps) -> None:
        """Local, once a rank of the job died (``train/survive.py``): stop this method's threads
        and fold into ``ps`` what already reached this rank, without talking to any other rank.
        Its MPI objects are dropped with the revoked communicator, never used again."""

    # ------------------------------------------------------------------ helpers
    def timed(self, key: str):
        """Adds the time spent inside to ``timers[key]``."""
        return timed(self.timers, key, self.comm.clock)
