"""The ``replay`` timeline: the order a real run recorded (``io/trace.py``), imposed on the virtual
ranks, and the comparison that names the first event where a replay differs from the run.

What is imposed: each server shard serves the workers' pushes in the recorded order; each gossip
read sees the recorded version of its peer's copy (a publisher waits until every recorded read of
its current version happened); the sample counter is updated in the recorded order; each push-sum
drain folds the recorded messages, added in the recorded order.  The rest of
the run is deterministic, so the replay redoes the same arithmetic.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..errors import UserError
from ..io import trace


class ReplayDiverged(UserError, RuntimeError):
    """A run that cannot be replayed as recorded (the message names why and where)."""


class Replay:
    def __init__(self, run_dir: str | Path, size: int, num_servers: int):
        self.run_dir, self.num_servers = Path(run_dir), num_servers
        self.events = [trace.read(run_dir, r) for r in range(size)]
        self.serves = [[e["w"] + num_servers for e in ev if e["e"] == "serve"] for ev in self.events]
        self.reads = [[(e["peer"], e["version"]) for e in ev if e["e"] == "read"] for ev in self.events]
        self.counts = [[e["old"] for e in ev if e["e"] == "count"] for ev in self.events]
        self.pending = Counter(pv for reads in self.reads for pv in reads)   # (peer, version) reads
        self.drains = [[({s: c for s, c in e["got"]}, e.get("order")) for e in ev if e["e"] == "drain"]
                       for ev in self.events]
        ckpts = [e for e in self.events[0] if e["e"] == "checkpoint"]
        extra = sorted({e["reason"] for e in ckpts if e["reason"] in ("stop", "clock")} |
                       ({"end"} if sum(e["reason"] == "end" for e in ckpts) > 1 else set()))
        if extra and any(self.drains):
            raise ReplayDiverged(f"{run_dir}: a push-sum run with checkpoints outside its final "
                                 f"schedule ({', '.join(extra)}: a stop signal, "
                                 "train.checkpoint_minutes, or a resume with more epochs); push-sum "
                                 "folds its inbox at each checkpoint and a replay does not place "
                                 "those phases yet, so it cannot be redone exactly")

    # the order -------------------------------------------------------------
    def next_serve(self, shard: int, k: int) -> int | None:
        """World rank of the worker whose push shard ``shard`` served k-th (None: past the end)."""
        s = self.serves[shard]
        return s[k] if k < len(s) else None

    def next_read(self, rank: int, k: int, peer: int) -> int | None:
        r = self.reads[rank]
        if k >= len(r):
            return None
        if r[k][0] != peer:
            raise ReplayDiverged(f"rank {rank}'s read {k} went to rank {peer}; the run read rank "
                                 f"{r[k][0]}")
        return r[k][1]

    def did_read(self, peer: int, version: int) -> None:
        if self.pending[(peer, version)] > 0:
            self.pending[(peer, version)] -= 1

    def reads_left(self, peer: int, version: int) -> int:
        return max(0, self.pending[(peer, version)])

    def next_drain(self, rank: int, k: int) -> tuple[dict, list | None] | None:
        """({sender: messages}, the senders in the order their messages were added, or None where
        the trace does not say) of rank ``rank``'s k-th drain (None: past the end)."""
        d = self.drains[rank]
        return d[k] if k < len(d) else None

    def next_count(self, rank: int, k: int) -> int | None:
        c = self.counts[rank]
        return c[k] if k < len(c) else None


def first_difference(real_dir: str | Path, replay_dir: str | Path, size: int) -> str | None:
    """None when both runs recorded the same events on every rank; else the first difference, in
    the order of the recorded events (rank by rank, earliest event first)."""
    found = []
    for r in range(size):
        # checkpoints are not exchanges: a resumed run has the earlier allocation's end in its trace
        a, b = ([e for e in trace.read(d, r) if e["e"] != "checkpoint"] for d in (real_dir, replay_dir))
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                what = ", ".join(f"{k}: run {x.get(k)} / replay {y.get(k)}" for k in sorted(set(x) | set(y))
                                 if x.get(k) != y.get(k))
                found.append((
                    i, f"rank {r}, event {i} ({x.get('e')}"
                       f"{', exchange ' + str(x['x']) if 'x' in x else ''}"
                       f"{', worker ' + str(x['w']) + ' exchange ' + str(x['seq']) if 'w' in x else ''}"
                       f"): {what}"))
                break
        else:
            if len(a) != len(b):
                found.append((min(len(a), len(b)), f"rank {r}: the run recorded {len(a)} events, the "
                              f"replay {len(b)}"))
    return min(found)[1] if found else None
