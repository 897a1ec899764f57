"""Training methods chosen by name behind one small interface.

A method decides *when and with whom* a worker exchanges *which flat buffer*; the model, optimizer,
data and metrics are the same for every method.  The loop calls, per step::

    loss = train_step(model, x, y)          # fills ps.grads, no communication
    method.after_backward(step, ps)         # e.g. all-reduce the gradients
    opt.step(ps.params, ps.grads, lr)
    method.after_update(step, ps)           # e.g. elastic / gossip averaging of the parameters

``single`` is the one-rank baseline; the distributed methods (allreduce, easgd, asgd, gossip)
register here as they land.
"""
from __future__ import annotations

from .single import Single

METHODS = {"single": Single}


def create(name: str, topo):
    """The method object for ``name`` (config validation already restricted the name)."""
    return METHODS[name](topo)
