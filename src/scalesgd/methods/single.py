"""``single``: one rank, no exchange — the baseline every distributed method is compared against."""
from __future__ import annotations


class MethodError(RuntimeError):
    """The method cannot run on this MPI world (wrong number of ranks, missing server...)."""


class Single:
    name = "single"

    def __init__(self, topo):
        if topo.size != 1:
            raise MethodError(
                f"method 'single' trains on one rank, but this job has {topo.size} ranks; the "
                "distributed methods (allreduce, easgd, asgd, gossip) are not available yet")
        self.topo = topo

    @property
    def num_workers(self) -> int:
        return 1

    @property
    def worker_index(self) -> int:
        return 0

    def start(self, ps) -> None:
        """Called once before training (distributed methods broadcast initial weights here)."""

    def after_backward(self, step: int, ps) -> None:
        """Gradients in ``ps.grads`` are final for this rank."""

    def after_update(self, step: int, ps) -> None:
        """Parameters in ``ps.params`` have been updated locally."""

    def close(self) -> None:
        """Called once after training."""
