"""Training methods chosen by name, each a ``base.Method`` (its members by concern, and their count:
docs/architecture.md; its fixed properties one frozen ``base.Traits``).

A method decides *when and with whom* a worker exchanges *which flat buffer*; the model, optimizer,
data, metrics and the control plane (``train/``) are the same for every method.
"""
from __future__ import annotations

import contextlib

from .allreduce import AllReduce
from .asgd import ASGD
from .base import Method, MethodError
from .easgd import EASGD
from .gossip import Gossip
from .localsgd import LocalSGD
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


def create(cfg, topo, signals) -> Method:
    """The method object for ``cfg.train.method`` on ``topo`` (a ``comm.topology.Topology``),
    carrying ``signals``; raises MethodError when it cannot run here (on every rank alike, before
    any collective)."""
    cls = method_class(cfg)
    cls.check_ranks(topo.size, cfg)
    if cfg.dist.hierarchy == "node" and cls is not AllReduce and cls is not Single:  # (allreduce: comm/)
        from .hierarchical import NodeGroup
        return NodeGroup(cfg, topo.roles(cls.servers_for(cfg)), topo.transport, signals, cls)
    return cls(cfg, topo.roles(cls.servers_for(cfg)), topo.transport, signals)


@contextlib.contextmanager
def evaluated(method: Method, ps):
    """Collective: inside, ``ps`` holds the model ``method`` evaluates (``load_eval_model``; the
    context value is its extra metrics); afterwards this rank's own params and BN statistics."""
    saved_p, saved_b = ps.params.copy(), ps.buffers.copy()
    try:
        yield method.load_eval_model(ps)
    finally:
        ps.params[...] = saved_p
        ps.buffers[...] = saved_b


__all__ = ["METHODS", "Method", "MethodError", "check_ranks", "create", "evaluated", "method_class"]
