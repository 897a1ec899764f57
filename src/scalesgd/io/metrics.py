"""Per-rank JSON-lines metrics: ``RUN_DIR/metrics/rank-K.jsonl``, one object per line."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import RunDirError
from .timetape import Stamp


class MetricsWriter:
    """Appends records (dicts of JSON scalars) for one rank; line-buffered so a crash loses little."""

    def __init__(self, run_dir: str | Path, rank: int):
        d = Path(run_dir) / "metrics"
        self.path = d / f"rank-{rank}.jsonl"
        try:                        # e.g. a run directory this rank's node cannot write
            d.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", buffering=1)
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot write metrics ({exc.strerror or exc})") from None
        self.rows = 0               # rows written by this writer

    def write(self, kind: str, **values) -> None:
        """A virtual rank's times are stamps: its tape learns which row and field each is
        (``io/timetape.py``), so the row can be re-timed."""
        for v in values.values():
            if isinstance(v, Stamp):
                v.tape.metrics_row(self.rows, values)
                break
        self._fh.write(json.dumps({"kind": kind, **values}) + "\n")
        self.rows += 1

    def close(self) -> None:
        self._fh.close()
