"""A run directory read back: ``metrics/rank-K.jsonl`` and ``config.json`` as the loop wrote them,
grouped per run, and the curves derived from them (the plot command, the benchmarks and the tests
read runs through this module only).

* Training curve: by default the step records of the *first worker* (rank 0, or rank 1 when rank 0
  is the parameter server), i.e. the minibatches one worker saw, smoothed with a trailing sliding
  window of ``window`` minibatches (Paine et al. use 400); the first ``window - 1`` points average
  what is available so far.  ``merge=True`` instead merges every worker's step records ordered by
  ``train_seconds`` (the global sequence of minibatches; less noisy, the window then spans
  ``window / workers`` steps per worker).
* Validation error: ``1 - val_top1_accuracy`` of the "val" records (the evaluated model: the
  average or centre, per method).
* Time split: the cumulative ``data/compute/comm/wait_seconds`` of each worker's last step record,
  averaged over the workers (servers write no step records).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPLIT_KINDS = ("compute", "comm", "wait", "data")


@dataclass
class RunData:
    """One run directory's records, grouped."""

    path: Path
    method: str
    ranks: int
    steps: dict[int, list[dict]]          # worker rank -> its step records, in order
    val: list[dict]                       # the evaluations (from the lowest rank that has them)
    label: str = ""
    virtual: dict | None = None           # a virtual cluster's run: its virtual.json (None: real)


def read_jsonl(path: Path) -> list[dict]:
    """Records of one JSON-lines file; a torn last line (a run killed mid-write) is skipped."""
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def load_run(run_dir: str | Path) -> RunData:
    """Reads ``RUN_DIR/metrics/rank-*.jsonl`` and ``config.json``; a clear error if they are missing."""
    run_dir = Path(run_dir)
    files = sorted((run_dir / "metrics").glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no metrics/rank-*.jsonl (not a scalesgd run directory?)")
    method = "?"
    if (run_dir / "config.json").exists():
        method = json.loads((run_dir / "config.json").read_text())["train"]["method"]
    steps, val = {}, []
    for f in files:
        recs = read_jsonl(f)
        rank_steps = [r for r in recs if r.get("kind") == "step"]
        if rank_steps:
            steps[int(f.stem.split("-")[1])] = rank_steps
        if not val:
            val = [r for r in recs if r.get("kind") == "val"]
    return RunData(run_dir, method, len(files), steps, val, virtual=read_virtual(run_dir))


def read_virtual(run_dir: Path) -> dict | None:
    """What a virtual cluster wrote about the run (``virtual.json``, else ``summary.json``'s
    ``virtual``: workers, profile, timeline ``model`` / ``replay`` / ``retime``); None for a run
    of real ranks.  A file that is not JSON is a ``ValueError`` naming it."""
    for name, key in (("virtual.json", None), ("summary.json", "virtual")):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            found = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        found = found.get(key) if key and isinstance(found, dict) else found
        if isinstance(found, dict):
            return found
    return None


def sliding_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start): (n,) -> (n,)."""
    v = np.asarray(values, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(1, len(v) + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


def training_records(run: RunData, merge: bool = False) -> list[dict]:
    """The first worker's step records, or every worker's merged by ``train_seconds``."""
    if not run.steps:
        return []
    if not merge:
        return run.steps[min(run.steps)]
    merged = [r for recs in run.steps.values() for r in recs]
    return sorted(merged, key=lambda r: r["train_seconds"])


def training_curve(run: RunData, window: int, merge: bool = False):
    """(train_seconds, epoch, smoothed top-1 error), each (n,)."""
    recs = training_records(run, merge)
    t = np.array([r["train_seconds"] for r in recs], dtype=np.float64)
    e = np.array([r["epoch"] for r in recs], dtype=np.float64)
    err = sliding_mean(np.array([r["top1_error"] for r in recs], dtype=np.float64), window)
    return t, e, err


def validation_curve(run: RunData):
    """(train_seconds, epoch, top-1 error) of the evaluations, each (m,)."""
    t = np.array([r["train_seconds"] for r in run.val], dtype=np.float64)
    e = np.array([r["epoch"] for r in run.val], dtype=np.float64)
    err = 1.0 - np.array([r["val_top1_accuracy"] for r in run.val], dtype=np.float64)
    return t, e, err


def time_split(run: RunData) -> dict[str, float]:
    """Seconds per kind (compute, comm, wait, data) at each worker's last step, averaged over workers."""
    lasts = [recs[-1] for recs in run.steps.values() if recs]
    return {k: float(np.mean([r.get(f"{k}_seconds", 0.0) for r in lasts])) if lasts else 0.0
            for k in SPLIT_KINDS}
