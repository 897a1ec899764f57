"""What a run may be told to suffer, for tests and experiments: a straggler's sleep after each
backward pass (``dist.straggler``) and injected faults (``SCALESGD_INJECT_FAULT``).  Both act
through the run's transport, so they mean the same in an MPI job and in the virtual cluster.
"""
from __future__ import annotations

import os

import numpy as np

from ..comm import watchdog
from ..config import parse_straggler
from ..errors import MethodError

ENV = "SCALESGD_INJECT_FAULT"
MODES = ("raise", "hang", "kill", "shared")


class Straggler:
    """Sleeps ``delay +- jitter`` ms after each backward pass on the chosen ranks (seeded)."""

    def __init__(self, spec: str, rank: int, seed: int, sleep):
        ranks, self.delay, self.jitter = parse_straggler(spec) if spec else ((), 0.0, 0.0)
        self.active = rank in ranks
        self.rng = np.random.default_rng([seed, rank, 0x57A6])
        self.sleep = sleep                 # the transport's (virtual: simulated seconds pass)

    def __call__(self) -> None:
        if self.active:
            ms = self.delay + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
            self.sleep(ms / 1000.0)


PLACES = ("step", "checkpoint", "evaluation")


def parse_faults(spec: str) -> dict[tuple[int, int, str], str]:
    """``RANK:STEP[:MODE[@PLACE]][,...]`` as {(rank, step, place): mode} (RANK ``*``: every rank,
    as rank -1; PLACE ``step`` by default)."""
    faults = {}
    for one in filter(None, spec.split(",")):
        rank, step, *rest = one.split(":")
        mode, _, place = (rest[0] if rest else "raise").partition("@")
        if mode not in MODES or (place or "step") not in PLACES:
            raise ValueError(f"{ENV}: {one!r}: MODE is one of {', '.join(MODES)}, PLACE one of "
                             f"{', '.join(PLACES)}")
        faults[-1 if rank == "*" else int(rank), int(step), place or "step"] = mode
    return faults


class Faults:
    """Testing aid: ``SCALESGD_INJECT_FAULT=RANK:STEP[:MODE][,...]`` (read once, at start) acts on
    that rank (as launched; ``*``: every rank) after that step (a server: after that many pushes
    served), or with ``@checkpoint`` / ``@evaluation`` inside the first checkpoint / evaluation
    that starts once that many steps are done, to check that a failing rank ends the whole job,
    never a hang (or, ``train.on_failure = continue``, that the others survive it).  MODE ``raise``
    (default): an exception (a bug); ``hang``: the rank blocks for ever in a receive nobody answers
    (a deadlock; only a stop's deadline ends it); ``kill``: the process dies at once (SIGKILL: a
    lost rank, ``train.on_failure``); ``shared``: a user error every rank hits alike (one line, no
    abort)."""

    def __init__(self, spec: str | None = None):
        self.spec = os.environ.get(ENV, "") if spec is None else spec
        self.at = parse_faults(self.spec)

    def inject(self, rank: int, step: int, transport, place: str = "step") -> None:
        """Acts on a fault of ``rank`` due at ``step`` (a phase's: due from ``step`` on, once)."""
        if not self.at:
            return
        if place == "step":
            key = next((k for k in ((rank, step, place), (-1, step, place)) if k in self.at), None)
        else:
            key = next((k for k in sorted(self.at) if k[0] in (rank, -1) and k[2] == place and k[1] <= step),
                       None)
        if key is None:
            return
        mode = self.at.pop(key) if place != "step" else self.at[key]
        said = f"{ENV}={self.spec}"
        if mode == "shared":
            raise MethodError(f"injected shared fault ({said})")
        if mode == "kill":                           # a lost rank (train.on_failure)
            transport.die()
        if mode == "hang":
            watchdog.doing(f"hung on purpose ({said})")
            transport.hang()
        raise RuntimeError(f"injected fault ({said})")
