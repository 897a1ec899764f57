"""The event order of a run: ``RUN_DIR/trace/rank-K.jsonl``, what a replay needs to redo it exactly.

A distributed run is deterministic except where the network decides an order; each rank records
those decisions, a few bytes per exchange, so that ``python -m scalesgd.virtual --replay RUN_DIR``
can step the same method code in the same order in one process (``virtual/``).  One JSON object
per line; ``e`` names the event:

=========  ===============  =============================================================
``e``      written by       fields
=========  ===============  =============================================================
``serve``  a server shard   ``w`` worker index, ``seq`` that worker's exchange number,
                            ``version`` after it, ``stale``, ``applied`` (0: rejected),
                            ``d`` the ``digest`` of the pushed slice
``read``   a gossip puller  ``x`` exchange number, ``peer`` rank, ``version`` of the peer's
                            published copy that was read (1 = its first publication),
                            ``d`` the ``digest`` of the copy
``count``  a gossip rank    ``x`` exchange number, ``old`` the global count before this
                            rank's ``Fetch_and_op``, ``add`` the samples added
``push``   push-sum         ``x`` exchange number, ``peer`` the rank the half was sent to
``drain``  push-sum         ``k`` drain number, ``got`` [[sender, messages of it folded]],
                            ``order`` the senders in the order their messages were added
                            (absent where the drain could not know it: ``comm/mpi/inbox.py``)
=========  ===============  =============================================================

Every rank also records ``checkpoint`` (``reason``: scheduled, end, stop, clock; ``boundary``)
when it writes one: a replay refuses a push-sum run with checkpoints outside its final schedule
(push-sum folds its inbox in each; the replay cannot place those phases yet).  Synchronous all-reduce needs
no event: every step is a collective in a fixed order.  A checkpoint
records how many lines each rank had written (``TraceWriter.lines``); a resumed run cuts its file
back to that, so the trace of a run that crashed and resumed is the trace of the run that
finished.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import RunDirError


def digest(a) -> str:
    """A cheap fingerprint of a host array's bits: the xor of at most 65,536 evenly spaced 4- or
    8-byte words, in hex (microseconds).  Two runs whose parameters differ anywhere differ in it
    within an exchange or two (an optimizer step changes every word)."""
    a = np.ascontiguousarray(a).reshape(-1)
    words = a.view(np.uint64 if a.dtype.itemsize == 8 else np.uint32)
    step = max(1, words.size // 65536)
    return format(int(np.bitwise_xor.reduce(words[::step])), "x")


class NoTrace:
    """Records nothing (a method outside a run, e.g. in unit tests)."""

    lines = 0
    active = False

    def record(self, event: str, **fields) -> None:
        pass

    def truncate(self, lines: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


NO_TRACE = NoTrace()


class TraceWriter(NoTrace):
    """Appends one rank's events, buffered (nothing on an exchange's path waits for the disk) and
    flushed at every checkpoint: a crash loses only events after the last checkpoint, which a resumed
    run would cut anyway."""

    active = True

    def __init__(self, run_dir: str | Path, rank: int):
        d = Path(run_dir) / "trace"
        self.path = d / f"rank-{rank}.jsonl"
        try:
            d.mkdir(parents=True, exist_ok=True)
            self.lines = sum(1 for _ in self.path.open()) if self.path.exists() else 0
            self._fh = self.path.open("a")
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot write the trace ({exc.strerror or exc})") from None

    def record(self, event: str, **fields) -> None:
        self._fh.write(json.dumps({"e": event, **fields}, separators=(",", ":")) + "\n")
        self.lines += 1

    def truncate(self, lines: int) -> None:
        """Keeps the first ``lines`` events (a resumed run continues from its checkpoint's)."""
        self._fh.close()
        kept = self.path.read_text().splitlines(keepends=True)[:lines]
        self.path.write_text("".join(kept))
        self.lines = len(kept)
        self._fh = self.path.open("a")

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class Recorder(NoTrace):
    """A run's recorder, handed to its method when the method is built (``train/control.Control``)
    and opened by the loop once the run's directory is known: records nothing until then."""

    def __init__(self):
        self.to: NoTrace = NO_TRACE

    def open(self, run_dir: str | Path, rank: int) -> "Recorder":
        self.to = TraceWriter(run_dir, rank)
        return self

    @property
    def active(self) -> bool:
        return self.to.active

    @property
    def lines(self) -> int:
        return self.to.lines

    def record(self, event: str, **fields) -> None:
        self.to.record(event, **fields)

    def truncate(self, lines: int) -> None:
        self.to.truncate(lines)

    def flush(self) -> None:
        self.to.flush()

    def close(self) -> None:
        self.to.close()


def read(run_dir: str | Path, rank: int) -> list[dict]:
    """Rank ``rank``'s events, in order ([] when the run wrote none)."""
    path = Path(run_dir) / "trace" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
