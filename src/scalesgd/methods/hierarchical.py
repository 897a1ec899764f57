"""``dist.hierarchy = "node"`` for gossip, local SGD, EASGD and A-SGD: a node's ranks act as one worker.

Built by composition (``node_group``), not by wrapping a method: its gradient role is
``gradients.SummedGradients`` over the node, its exchange and codec a ``NodeLeader`` around the
method's own exchange, its server role the method's own.  Inside a node (``transport.node_split()``:
MPI's shared-memory node) the ranks average their gradients every step (a bucketed all-reduce over
the node's communicator, overlapping backward: ``grad_scale`` = 1 / ranks on the node), so the
node's replicas take the same steps and stay identical.  Between nodes, the node's lowest rank
(its *leader*) runs the method (gossip: pull or push-sum, any graph, blocking or overlapped; local
SGD: the leaders' average every ``tau`` steps, with SlowMo) with the other leaders, exactly as a
flat run of one rank per node would, counting the whole node's samples.  Every step the node
takes the leader's global count and signals (so its ranks enter an evaluation or checkpoint
together; a member's stop request reaches the leader first, through a node max of the raised
signals), and after each of the leader's exchanges
(every ``tau`` steps, the same step on every rank of the node) its parameters.  Only the leaders'
exchanges cross the network: one per node instead of one per rank.

Evaluation: the BN statistics are averaged inside each node, then the leaders average parameters
and statistics as flat gossip does, and broadcast them to their node.  Checkpoints: each rank
saves its own state (a leader its gossip state; ``quiesce`` first folds the leaders' inboxes and
broadcasts the result, so a node's replicas are identical in the file); a resume restores them.
The server methods: each server rank is a group of its own (``node_split(alone=True)``) and keeps
its rank among the leaders, so the method's server role serves the node groups' leaders.
A resume on the same rank count must keep the split into nodes (else refused: a leader's state
is the method's, a member's only the base's); on another rank count (``resuming.origin``) every
new rank continues a saved *leader* and the averaging methods start from the saved leaders'
average.  A lost rank (``--on-failure continue``): the survivors form their node groups again; a
group whose leader died is led on by its member with the lowest rank, from its own replica with a
fresh exchange history (``adopt`` of an ``Origin`` of kind "survive" whose state is a member's).
In the virtual cluster the
split is the profile's nodes (``virtual/nodes.py``), the same code runs over it.
"""
from __future__ import annotations

import dataclasses
import logging
import types

import numpy as np

from ..comm.topology import Roles
from ..io.trace import NO_TRACE
from .base import Exchange, MethodError, Traits
from .gradients import SummedGradients
from .roles import Method


def node_group(cfg, roles, comm, signals, trace, inner_cls) -> Method:
    """Collective: ``inner_cls``'s method (a gossip strategy, local SGD, EASGD or A-SGD) run by
    node groups: the node's gradient sum, the leader's exchange around the method's, and on a
    server rank (a group of its own) the method's server."""
    split = comm.node_groups(alone=roles.is_server)    # collective: the job's one node split
    _check_split(cfg, roles, split, inner_cls)
    inner = None
    if split.is_leader:                                # servers keep ranks 0..K-1 among leaders
        leaders = split.leaders
        sub = types.SimpleNamespace(rank=leaders.rank, size=leaders.size, transport=leaders)
        inner = inner_cls(cfg, Roles.of(sub, roles.num_servers), leaders, signals, trace)
    leader = NodeLeader(cfg, roles, comm, signals, trace, split, inner)
    grads = SummedGradients(split.node, dataclasses.replace(cfg.dist, hierarchy="none"), leader.timers)
    return Method(inner_cls.name, Traits(reshape_replica=inner_cls.traits.reshape_replica), roles, comm,
                  grads, leader, leader, inner if roles.is_server else None, node_split=split)


def _check_split(cfg, roles, split, inner_cls) -> None:
    """Refuses node groups the method cannot use (on every rank alike), and says what runs."""
    name, groups = inner_cls.name, sorted(set(split.sizes))
    if inner_cls.traits.lockstep and len(groups) > 1:     # (its count is samples x groups x group size)
        raise MethodError(f"dist.hierarchy = node: {name} counts samples in lockstep and needs "
                          f"the same number of ranks in every node group (got {groups})")
    if split.num_nodes < 2:
        raise MethodError(f"dist.hierarchy = node: {name} runs between nodes, but all {roles.size} "
                          "ranks are on one node (MPI's shared-memory split; a virtual run's profile, "
                          "ranks_per_node): drop --hierarchy (or run across nodes)")
    if roles.rank == 0:
        logging.getLogger("scalesgd").info(
            "%s: node groups (dist.hierarchy = node): %d group(s) of %s rank(s); their leaders run "
            "the method", name, split.num_nodes, "/".join(str(g) for g in groups))


class NodeLeader(Exchange):
    """A node group's exchange and codec: on the leader, ``inner`` (the method's exchange among the
    leaders), then the node takes the leader's count, signals and, after an exchange, parameters;
    on a member (``inner`` None) only the node's part."""

    def __init__(self, cfg, roles, comm, signals, trace, split, inner):
        Exchange.__init__(self, cfg, roles, comm, signals, trace)
        self.node, self.inner = split.node, inner
        self.group = [split.leader_rank, self.node.size]   # (its leader's job rank, its size)
        self.num_nodes = split.num_nodes
        if inner is not None:
            self.timers = inner.timers                    # one set of timers: the loop reads these

    @property
    def exchanges(self) -> int:
        """The leader's method's exchanges (0 on a member)."""
        return self.inner.exchanges if self.inner is not None else 0

    def start(self, ps) -> None:
        super().start(ps)                                  # rank 0's weights everywhere
        if self.inner is not None:
            self.inner.start(ps)                           # collective among the leaders

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        """Every step the node agrees on the leader's count and signals (so its ranks enter a phase
        together); when the leader's method exchanged this step (gossip, EASGD: every ``tau``;
        A-SGD: every ``n_sync``; local SGD: every ``tau``) it also takes the leader's parameters."""
        if self.node.size > 1:                             # members' stop requests reach the leader
            raised = self.node.allreduce_max_host(self.signals.raised)
            np.maximum(self.signals.raised, raised, out=self.signals.raised)
        before = self.exchanges
        if self.inner is not None:
            self.global_samples = self.inner.after_update(step, ps, samples * self.node.size, lr)
        if self.node.size > 1:
            with self.timed("comm"):
                if self._sync_head(exchanged=self.exchanges != before):
                    self._from_leader(ps.params)
        return self.global_samples

    def _sync_head(self, exchanged: bool = False) -> bool:
        """Collective on the node: every rank takes the leader's count and signals, and whether
        the leader exchanged (returned)."""
        head = np.concatenate([[self.global_samples], self.signals.seen, [int(exchanged)]]).astype(np.int64)
        self.node.broadcast(head, 0)
        self.global_samples = int(head[0])
        self.signals.merge(head[1:3])
        return bool(head[3])

    def _from_leader(self, arr) -> None:
        self.node.broadcast(arr, 0)

    def quiesce(self, ps) -> None:
        if self.inner is not None:
            self.inner.quiesce(ps)
            self.global_samples = self.inner.global_samples
        if self.node.size > 1:                             # a node's replicas and count identical
            self._from_leader(ps.params)                   # in the file
            self._sync_head()

    def load_eval_model(self, ps) -> dict:
        if self.node.size > 1:
            self.node.allreduce_mean(ps.buffers)
        extra = self.inner.load_eval_model(ps) if self.inner is not None else {}
        if self.node.size > 1:
            self._from_leader(ps.params)
            self._from_leader(ps.buffers)
        return extra

    def stats(self) -> dict:
        return self.inner.stats() if self.inner is not None else {}

    # ------------------------------------------------------------------ checkpoints
    def state(self, ps) -> tuple[dict, dict]:
        """The inner method's state (a leader) or the base state (a member), and the rank's node
        group, so that a resume onto another split of ranks into nodes continues the saved leaders
        (``resuming.groups_moved``)."""
        arrays, scalars = self.inner.state(ps) if self.inner is not None else super().state(ps)
        return arrays, {**scalars, "node_group": self.group, "node_groups": self.num_nodes}

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        """A leader: the inner method's state; a member: the base's."""
        if self.inner is not None:
            self.inner.load_state(ps, arrays, scalars)
            self.global_samples = self.inner.global_samples
        else:
            super().load_state(ps, arrays, scalars)

    def adopt(self, ps, opt, origin) -> dict:
        """Collective on the job: a leader's inner method takes ``origin`` among the leaders (a
        reshape continues a saved leader: ``resuming.source_rank``), a member the base's part;
        then every rank of a node takes the leader's count and signals."""
        if self.inner is not None:                         # the leaders' job was one of groups
            groups = origin.own.method.get("node_groups", origin.old_size)
            out = self.inner.adopt(ps, opt, dataclasses.replace(origin, old_size=groups))
            self.global_samples = self.inner.global_samples
        else:
            out = super().adopt(ps, opt, origin)
        if self.node.size > 1:
            self._sync_head()
        return out

    def abandon(self, ps) -> None:
        """Local, a rank of the job died: the leader's method stops what it had in flight (the
        node's gradient sum is dropped with the revoked communicators)."""
        if self.inner is not None:
            self.inner.abandon(ps)
