"""The sweeps' output: matplotlib figures without a display, and numbers formatted for the tables."""
from __future__ import annotations

import numpy as np


def new_figure(rows: int, cols: int, w: float = 4.2, h: float = 3.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    fig = Figure(figsize=(w * cols, h * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    return fig, axes


def fmt(x, spec=".3g", none="—"):
    return none if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def pm(agg: dict, scale: float = 1.0, spec: str = ".3g") -> str:
    """'mean [min, max]' of one aggregated measure."""
    if agg["mean"] is None:
        return "never"
    s = fmt(agg["mean"] * scale, spec)
    if agg["n"] > 1:
        s += f" [{fmt(agg['min'] * scale, spec)}, {fmt(agg['max'] * scale, spec)}]"
    if agg.get("missing"):
        s += f" ({agg['missing']} never)"
    return s
