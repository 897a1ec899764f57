"""Training methods chosen by name behind one small interface (see ``base.Method``).

A method decides *when and with whom* a worker exchanges *which flat buffer*; the model, optimizer,
data and metrics are the same for every method.
"""
from __future__ import annotations

from .allreduce import AllReduce
from .asgd import ASGD
from .base import Method, MethodError, Phases, Stopped, eval_boundaries
from .easgd import EASGD
from .gossip import Gossip
from .single import Single

METHODS = {"single": Single, "allreduce": AllReduce, "easgd": EASGD, "asgd": ASGD, "gossip": Gossip}


def create(cfg, topo) -> Method:
    """The method object for ``cfg.train.method``; raises MethodError when it cannot run here."""
    name = cfg.train.method
    if name not in METHODS:
        raise MethodError(f"method '{name}' is not available in this build")
    return METHODS[name](cfg, topo)


__all__ = ["METHODS", "Method", "MethodError", "Phases", "Stopped", "create", "eval_boundaries"]
