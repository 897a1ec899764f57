"""Per-rank JSON-lines metrics: ``RUN_DIR/metrics/rank-K.jsonl``, one object per line."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..errors import RunDirError


class MetricsWriter:
    """Appends records (dicts of JSON scalars) for one rank; line-buffered so a crash loses little."""

    def __init__(self, run_dir: str | Path, rank: int, observe: Callable[[int, dict], None] | None = None):
        """``observe(row, values)``, where given, sees each row as it is written (the virtual
        cluster's tape: which row and field holds which of its clock's times)."""
        d = Path(run_dir) / "metrics"
        self.path = d / f"rank-{rank}.jsonl"
        try:                        # e.g. a run directory this rank's node cannot write
            d.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", buffering=1)
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot write metrics ({exc.strerror or exc})") from None
        self.rows = 0               # rows written by this writer
        self.observe = observe

    def write(self, kind: str, **values) -> None:
        if self.observe is not None:
            self.observe(self.rows, values)
        self._fh.write(json.dumps({"kind": kind, **values}) + "\n")
        self.rows += 1

    def close(self) -> None:
        self._fh.close()
