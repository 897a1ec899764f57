"""Training methods chosen by name, each a ``roles.Method``: four roles that compose (gradients,
exchange, server, codec) and one frozen ``base.Traits`` (docs/architecture.md: what a new method
writes, and the count).

A method decides *when and with whom* a worker exchanges *which flat buffer*; the model, optimizer,
data, metrics and the control plane (``train/``) are the same for every method.
"""
from __future__ import annotations

import contextlib

from ..io.trace import NO_TRACE
from .allreduce import AllReduce
from .asgd import ASGD
from .base import Exchange, MethodError
from .easgd import EASGD
from .gossip import Gossip
from .gradients import LocalGradients, SummedGradients
from .localsgd import LocalSGD
from .roles import Method
from .single import Single

# keys == choices.METHODS
METHODS = {cls.name: cls for cls in (Single, AllReduce, EASGD, ASGD, Gossip, LocalSGD)}


def method_class(cfg) -> type:
    """The class that runs ``cfg.train.method`` with ``cfg`` (a family picks one strategy)."""
    name = cfg.train.method
    if name not in METHODS:
        raise MethodError(f"method '{name}' is not available in this build")
    return METHODS[name].select(cfg)


def check_ranks(cfg, size: int) -> None:
    """Raises MethodError when ``cfg``'s method cannot run on ``size`` ranks (no communication)."""
    method_class(cfg).check_ranks(size, cfg)


def create(cfg, topo, signals, trace=NO_TRACE) -> Method:
    """The method for ``cfg.train.method`` on ``topo`` (a ``comm.topology.Topology``), carrying
    ``signals`` and recording into ``trace``; raises MethodError when it cannot run here (on every
    rank alike, before any collective)."""
    cls = method_class(cfg)
    cls.check_ranks(topo.size, cfg)
    roles, comm = topo.roles(cls.servers_for(cfg)), topo.transport
    if cfg.dist.hierarchy == "node" and cls.traits.node_agents:
        from .hierarchical import node_group
        return node_group(cfg, roles, comm, signals, trace, cls)
    exchange = cls(cfg, roles, comm, signals, trace)
    grads = (SummedGradients(comm, cfg.dist, exchange.timers, signals) if cls.traits.sums_gradients
             else LocalGradients())
    return Method(cls.name, cls.traits, roles, comm, grads, exchange, exchange,
                  exchange if roles.is_server else None)


@contextlib.contextmanager
def evaluated(method: Method, ps):
    """Collective: inside, ``ps`` holds the model ``method`` evaluates (its exchange's
    ``load_eval_model``; the
    context value is its extra metrics); afterwards this rank's own params and BN statistics."""
    saved_p, saved_b = ps.params.copy(), ps.buffers.copy()
    try:
        yield method.exchange.load_eval_model(ps)
    finally:
        ps.params[...] = saved_p
        ps.buffers[...] = saved_b


__all__ = ["METHODS", "Exchange", "Method", "MethodError", "check_ranks", "create", "evaluated",
           "method_class"]
