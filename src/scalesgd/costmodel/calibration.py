"""Reads ``benchmarks/calibrate.py``'s JSON and turns it into model inputs.

* ``table(cal, kind, ranks)``: {bytes: seconds} of one measured operation (allreduce, get,
  accumulate, server) at a rank count; ``at(table, nbytes)`` interpolates it log-log (extrapolates
  with the end segments).
* ``fit_link(table)``: latency and bandwidth of ``T = alpha + S / B``, least squares weighted by
  1/T (relative error), with the largest relative misfit, so a report can say how well a straight
  line describes the measurements.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class CalibrationError(ValueError):
    pass


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"{path}: no calibration file (measure one: python benchmarks/calibrate.py)")
    cal = json.loads(path.read_text())
    for key in ("compute", "mpi", "end_to_end"):
        if key not in cal:
            raise CalibrationError(f"{path}: not a calibration file (no '{key}')")
    return cal


def ranks_measured(cal: dict) -> list[int]:
    return sorted(int(p) for p in cal["mpi"])


def table(cal: dict, kind: str, ranks: int) -> dict[float, float]:
    key = str(ranks)
    if key not in cal["mpi"]:
        raise CalibrationError(f"calibration has no {ranks}-rank measurements "
                               f"(it has {ranks_measured(cal)}); "
                               f"rerun benchmarks/calibrate.py --ranks ... {ranks}")
    return {float(k): float(v) for k, v in cal["mpi"][key][kind].items()}


def at(tab: dict[float, float], nbytes: float) -> float:
    xs = np.log(np.array(sorted(tab)))
    ys = np.log(np.array([tab[k] for k in sorted(tab)]))
    x = np.log(nbytes)
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        i = int(np.searchsorted(xs, x)) - 1
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(np.exp(ys[i] + slope * (x - xs[i])))


def fit_link(tab: dict[float, float]) -> tuple[float, float, float]:
    """(alpha seconds, bandwidth bytes/s, max relative misfit) of T = alpha + S / B."""
    s = np.array(sorted(tab), dtype=np.float64)
    t = np.array([tab[k] for k in sorted(tab)], dtype=np.float64)
    a = np.stack([np.ones_like(s), s], axis=1) / t[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_b = max(float(coef[0]), 0.0), max(float(coef[1]), 1e-30)
    fit = alpha + s * inv_b
    return alpha, 1.0 / inv_b, float(np.max(np.abs(fit - t) / t))
