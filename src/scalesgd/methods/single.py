"""``single``: one rank, no exchange — the baseline every distributed method is compared against."""
from __future__ import annotations

from .base import Method, MethodError


class Single(Method):
    name = "single"

    def __init__(self, cfg, topo):
        if topo.size != 1:
            raise MethodError(
                f"method 'single' trains on one rank, but this job has {topo.size} ranks; "
                "choose --method allreduce, easgd, asgd or gossip")
        super().__init__(cfg, topo)
