"""Per-rank JSON-lines metrics: ``RUN_DIR/metrics/rank-K.jsonl``, one object per line."""
from __future__ import annotations

import json
from pathlib import Path


class MetricsWriter:
    """Appends records (dicts of JSON scalars) for one rank; line-buffered so a crash loses little."""

    def __init__(self, run_dir: str | Path, rank: int):
        d = Path(run_dir) / "metrics"
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"rank-{rank}.jsonl"
        self._fh = self.path.open("a", buffering=1)

    def write(self, kind: str, **values) -> None:
        self._fh.write(json.dumps({"kind": kind, **values}) + "\n")

    def close(self) -> None:
        self._fh.close()
