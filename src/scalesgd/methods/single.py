"""``single``: one rank, no exchange — the baseline every distributed method is compared against."""
from __future__ import annotations

from .base import Exchange, MethodError, Traits


class Single(Exchange):
    name = "single"
    traits = Traits(node_agents=False)

    @classmethod
    def check_ranks(cls, size: int, cfg) -> None:
        if size != 1:
            raise MethodError(
                f"method 'single' trains on one rank, but this job has {size} ranks; "
                "choose --method allreduce, easgd, asgd or gossip")
