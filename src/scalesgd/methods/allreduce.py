"""``allreduce``: synchronous SGD.  Every step the flat gradient buffer is averaged over all ranks
with MPI all-reduce (bucketed, started during backward: its gradient role,
``gradients.SummedGradients`` over the job), so every rank applies the same update and the replicas
stay identical (initial weights broadcast from rank 0 in ``start``).

Its exchange after the update only counts: the stop and checkpoint signals came with the sum's
barrier after backward (the step's only small collective: one small-message latency per step).

BN running statistics stay per replica during training (each rank normalises its own minibatch, as
in PyTorch DDP); they are averaged over ranks when the model is evaluated.
"""
from __future__ import annotations

from .base import Exchange, Traits


class AllReduce(Exchange):
    name = "allreduce"
    # the gradients' sum is checked (a dead rank) before the update uses it; dist.hierarchy = node
    # makes its sum hierarchical (comm/), not its agents
    traits = Traits(replicas_identical=True, check_after="backward", sums_gradients=True,
                    node_agents=False)

    def after_update(self, step: int, ps, samples: int, lr: float = 0.0) -> int:
        """The signals came with the barrier after backward (one rank: its own): no collective."""
        if self.roles.size == 1:
            self.signals.merge(self.signals.raised)
        return self.count(samples)

    def load_eval_model(self, ps) -> dict:
        """The replicas are identical; average the per-replica BN statistics."""
        self.comm.allreduce_mean(ps.buffers)
        return {}
