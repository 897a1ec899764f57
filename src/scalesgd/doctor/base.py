"""What every check shares: the row, the statuses and thresholds, the context a check gets."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

OK, WARN, FAIL, NA = "ok", "warn", "fail", "n/a"
RMA_WAITED = 0.25          # an RMA latency above this fraction of the target's compute time = waited
INTRA_MIN_FRACTION = 0.05  # intra-node all-reduce bus bandwidth below this share of a memory copy: warn
NETWORK_MIN_GBS = 1.0      # across nodes below this (10 Gbit/s Ethernet): warn
DISK_FAIL_GB, DISK_WARN_GB = 1.0, 10.0
DECODED_PER_SHARD = 4      # samples strictly decoded at the start of every shard


@dataclass
class Check:
    """One row of the table (and of doctor.json): ``fix`` is empty exactly when ``status`` is ok."""

    name: str
    status: str
    result: str
    fix: str = ""
    data: dict = field(default_factory=dict)




# ----------------------------------------------------------------------------- the run
class Ctx:
    """What every check gets: the arguments, how MPI came up, and where this rank is.  Every rank
    runs every check and gets a row back; only rank 0's rows are reported, so a row may rest on what
    rank 0 alone measured."""

    def __init__(self, args, start, deadline):
        from ..comm.mpi import probe
        self.args, self.start, self.topo, self.deadline = args, start, start.topo, deadline
        self.rank = self.topo.rank if self.topo else 0
        self.size = self.topo.size if self.topo else 1
        self.local_rank = self.topo.local_rank if self.topo else 0
        self.nodes = probe.node_ids(self.topo) if self.topo else np.zeros(1, np.int64)   # (size,)
        self.gpus: list[dict] | None = None      # every rank's gpu_facts, once check_cupy_cuda ran

    @property
    def num_nodes(self) -> int:
        return len(set(self.nodes.tolist()))

    def gather(self, obj) -> list:
        """Collective: every rank's JSON-able ``obj``, in rank order (as text, no pickle)."""
        if self.topo is None:
            return [obj]
        from ..comm.mpi.collectives import allgather_text
        return [json.loads(t) for t in allgather_text(self.topo.comm, json.dumps(obj))]

    def on_leaders(self, fn) -> list:
        """Collective: ``fn()`` run by each node's local rank 0, gathered: one result per node."""
        mine = fn() if self.local_rank == 0 else None
        return [r for r in self.gather(mine) if r is not None]
