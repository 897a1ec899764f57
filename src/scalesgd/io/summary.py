"""Pure helpers for ``summary.json`` and plots: time to reach target validation errors."""
from __future__ import annotations

from typing import Iterable, Sequence

DEFAULT_TARGETS = (0.5, 0.3, 0.1, 0.05)


def target_key(target: float) -> str:
    """The JSON key of a target error: 0.3 -> "0.3" (shortest repr, stable across runs)."""
    return repr(float(target))


def time_to_targets(val_records: Iterable[dict],
                    targets: Sequence[float] = DEFAULT_TARGETS) -> dict[str, dict | None]:
    """For each target top-1 *error*, the first validation record with ``1 - val_top1_accuracy <=
    target``: ``{"0.3": {"train_seconds": s, "epoch": e, "global_samples": n, "val_top1_error": err},
    "0.05": None, ...}`` (None = never reached).  Records are taken in ``global_samples`` order
    (records without it keep their given order); ``train_seconds`` is training time with evaluation
    excluded, as written by the loop.  Keys are ``target_key(target)`` so the dict is valid JSON.
    """
    recs = [r for r in val_records if "val_top1_accuracy" in r]
    if all("global_samples" in r for r in recs):
        recs = sorted(recs, key=lambda r: r["global_samples"])
    out: dict[str, dict | None] = {}
    for target in targets:
        hit = next((r for r in recs if 1.0 - r["val_top1_accuracy"] <= target), None)
        out[target_key(target)] = None if hit is None else dict(
            train_seconds=hit.get("train_seconds"), epoch=hit.get("epoch"),
            global_samples=hit.get("global_samples"), val_top1_error=1.0 - hit["val_top1_accuracy"])
    return out
