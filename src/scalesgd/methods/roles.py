"""A method is four roles that compose, and its traits (``base.Traits``): what a newcomer learns.

The roles, each a ``typing.Protocol`` (a test checks that every implementation has their members):

- **gradients** (``GradientReducer``): what happens to a step's gradients before the update.
  ``gradients.LocalGradients`` (nothing: every method but all-reduce) or
  ``gradients.SummedGradients`` (a bucketed all-reduce started during backward, over the job for
  all-reduce, over a node for node groups).
- **exchange** (``ParameterExchange``): what a worker does after its local update, and the global
  count it returns: nothing but counting (``single``, ``allreduce``), an average every tau steps
  (``localsgd``), a push to and a reply from the servers (``easgd``, ``asgd``), a gossip exchange
  (``gossip``), or a node's leader running one of those for its node (``hierarchical``).
- **server** (``ServerRole``): on a parameter-server rank, serving workers until a phase ends the
  run (``server.ServerMethod``); None on every other rank.
- **codec** (``StateCodec``): the method's state in a checkpoint, and taking the state a rank
  continues after a resume or a lost rank.  The exchange is its own codec: they share the state.

``Method`` is the record the loop holds; ``methods.create`` builds it.  Like torch.distributed's
comm hook (per bucket) beside its model averager (after the step), and a hierarchy built from an
averager rather than by overriding one: a node group is ``SummedGradients`` over the node plus a
leader's exchange around the method's own (``hierarchical.NodeLeader``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .base import Traits


class GradientReducer(Protocol):
    """What a step's gradients go through between backward and the update."""

    grad_scale: float              # factor on every gradient, applied for free through dL/dlogits
    engine: object                 # its all-reducer (``transport``, ``on_host``, ``device_seconds``)
                                   # where it has one, else None

    def attach(self, model) -> None:
        """Collective, once the model exists and before ``start`` (e.g. hooks into backward)."""

    def after_backward(self, step: int, ps, loss_finite: bool) -> bool:
        """Gradients in ``ps.grads`` are final on this rank, whose loss of the step was
        ``loss_finite``; returns whether the step diverged: this rank's loss, or, where the
        replicas are identical (``traits.replicas_identical``), any rank's."""

    def progress(self) -> None:
        """Called while the host waits for the device to finish a step (GPU only): keep the sum
        moving (start the buckets whose copies landed)."""

    def settle(self, wait: bool = False) -> None:
        """Adds to the timers the communication measured on the device rather than on the host
        clock (an all-reduce the host only enqueues: NCCL), as far as the device has finished it
        (``wait``: all of it).  Called where the stream was synchronized anyway."""

    def use_host_transport(self) -> None:
        """The start-up check's fallback (fastpaths/): sum through MPI on host copies from now on."""

    def close(self) -> None:
        """Frees its communicator (NCCL) and requests; once, after training."""


class ParameterExchange(Protocol):
    """What a worker does after its local update."""

    global_samples: int            # the job's count, as far as this rank knows it
    exchanges: int                 # exchanges so far (a server: pushes served)
    timers: dict                   # {"comm": s, "wait": s}: the method's, shared by its roles

    def start(self, ps) -> None:
        """Collective: every replica rank 0's, then the exchange's windows, ports, buffers."""

    def after_update(self, step: int, ps, samples: int, lr: float) -> int:
        """Parameters were updated locally from ``samples`` samples at learning rate ``lr``;
        returns the global count."""

    def load_eval_model(self, ps) -> dict:
        """Collective: puts the model to evaluate into ``ps``; may return extra metrics.  The
        caller restores ``ps`` afterwards (``methods.evaluated``)."""

    def stats(self) -> dict:
        """Values for the per-step metrics (staleness, exchanges...)."""

    def close(self) -> None:
        """Collective: frees windows and other MPI objects; once, after training, on every rank."""


class ServerRole(Protocol):
    """A parameter-server rank's work."""

    global_samples: int
    exchanges: int

    def serve(self, ps, phases) -> None:
        """Serve workers until a phase ends training.  ``phases`` (``train.phases.Phases``):
        ``due(gs, sig)`` with the count and the signals every worker has been told of, then
        ``enter(gs)``, the collective phase (True when training is over)."""

    def poll_in_phase(self) -> None:
        """Run while the server waits in a phase agreement; raises when the agreement can never
        complete (a push arrived, so a worker is not there)."""

    def stats(self) -> dict:
        """The server's counters, written at every evaluation."""


class StateCodec(Protocol):
    """The method's state beyond the replica and momentum, across checkpoints and lost ranks."""

    def state(self, ps) -> tuple[dict, dict]:
        """(arrays, JSON scalars) for a checkpoint."""

    def load_state(self, ps, arrays: dict, scalars: dict) -> None:
        """Restores what ``state`` returned (after ``start``: windows and ports exist)."""

    def adopt(self, ps, opt, origin) -> dict:
        """Collective, after ``start``: takes the state this rank continues (``rankstate.Origin``:
        a resume on the same ranks, on other ranks, or the survivors of a lost rank); returns what
        a failure's record should say."""

    def quiesce(self, ps) -> None:
        """Collective, inside a phase: fold pending incoming state into ``ps`` (complete for a
        checkpoint)."""

    def abandon(self, ps) -> None:
        """Local, once a rank died: stop this method's threads, keep what already arrived."""


ROLES = {"gradients": GradientReducer, "exchange": ParameterExchange, "server": ServerRole,
         "codec": StateCodec}


@dataclass(eq=False)
class Method:
    """One rank's method: its roles, its traits, and what the loop reads of the job it runs on."""

    name: str
    traits: Traits
    roles: object                  # this rank's role in the job (``comm.topology.Roles``)
    comm: object                   # the job's transport
    gradients: GradientReducer
    exchange: ParameterExchange
    codec: StateCodec
    server: ServerRole | None = None   # on a server rank
    node_split: object = None      # the job's node groups (``dist.hierarchy = node``), else None

    @property
    def timers(self) -> dict:
        return self.exchange.timers

    @property
    def global_samples(self) -> int:
        """The job's count as this rank knows it (a server's: pushes it added)."""
        return (self.server or self.exchange).global_samples

    def start(self, ps) -> None:
        """Collective: identical replicas, then the exchange's windows and ports."""
        self.exchange.start(ps)

    def close(self) -> None:
        """Collective: the exchange's windows, the gradient sum's communicator, the node split."""
        self.exchange.close()
        self.gradients.close()
        if self.node_split is not None:
            self.node_split.free()             # (its rank and size stay readable)
