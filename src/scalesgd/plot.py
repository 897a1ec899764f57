"""``python -m scalesgd.plot RUN_DIR [RUN_DIR ...] -o fig.png`` (also ``scalesgd-plot``): the figures.

Writes ``fig.png`` (training and validation top-1 error against training time and epochs, one
line per run) and ``fig_time.png`` (the time split per run); with ``--target`` prints when each
run first reached that validation error.  Without ``-o`` the figures go next to the first run
directory: ``runs/A`` -> ``runs/A_fig.png`` and ``runs/A_fig_time.png``.

The runs are read by ``io/runs.py`` (which also defines the curves: first worker or merged,
sliding window, validation error, time split); this module only chooses what to draw and draws it,
with matplotlib's ``Figure`` on the Agg canvas (no pyplot, no display needed).  Choices, documented
in ``docs/cli.md``:

* The smoothing window is capped at a quarter of the shortest curve (a window as long as the run
  would draw a cumulative mean, not a sliding one); the titles give the window used.
* Error axes are fixed to 0-100 % so that figures compare at a glance; the legend is laid out in as
  many rows as its labels need to fit the figure's width, and long run labels are wrapped under
  the bars of the time split.
* x axes: ``train_seconds`` (training wall-clock time, evaluation excluded) shown in seconds,
  minutes or hours depending on the longest run, and the global epoch (global samples / epoch).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .io.runs import (SPLIT_KINDS, RunData, load_run, time_split, training_curve, training_records,
                      validation_curve)
from .io.summary import target_key, time_to_targets

SPLIT_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "wait": "#C44E52", "data": "#8C8C8C"}
WINDOWS_PER_CURVE = 4          # the smoothing window spans at most 1/4 of the shortest training curve
TICK_LABEL_CHARS = 16          # time split: run labels wrapped to lines of at most this many characters


@dataclass
class Series:
    label: str
    x: np.ndarray
    y: np.ndarray


@dataclass
class PlotResult:
    """What was drawn: ``panels[name]`` holds one Series per run that had data for that panel;
    names are train_time, train_epochs, val_time, val_epochs."""

    paths: list[Path]
    panels: dict[str, list[Series]] = field(default_factory=dict)
    split: dict[str, dict[str, float]] = field(default_factory=dict)
    reached: dict[str, dict | None] = field(default_factory=dict)   # label -> time_to_targets entry
    time_unit: str = "s"
    window: int = 0                       # the smoothing window used (after the cap) ...
    window_asked: int = 0                 # ... and the one asked for
    shortest: int = 0                     # minibatches in the shortest training curve
    figures: list = field(default_factory=list)    # the matplotlib Figures drawn (curves, split)


def kind_mark(virtual: dict | None) -> str:
    """How a run's times were made, for its label: "" (real ranks), ``virtual, PROFILE``,
    ``re-timed, PROFILE`` (a profile's and, when not ``none``, a variability condition's names)
    or ``replay`` (a real run's recorded order, redone)."""
    if virtual is None:
        return ""
    timeline = virtual.get("timeline", "model")
    if timeline == "replay":
        return "replay"
    names = [d.get("name") if isinstance(d, dict) else d
             for d in (virtual.get("profile"), virtual.get("condition"))]
    names = [str(n) for n in names if n and n != "none"]
    return ", ".join(["re-timed" if timeline == "retime" else "virtual", *names])


def assign_labels(runs: list[RunData], labels: list[str] | None = None) -> None:
    """``method ×ranks``, with ``(virtual, PROFILE)``, ``(re-timed, PROFILE)`` or ``(replay)`` for
    a virtual cluster's run (``kind_mark``); runs that would share a label get their directory name
    appended.  A label given in ``labels`` is used as it is."""
    base = [f"{r.method} \u00d7{r.ranks}" + (f" ({kind_mark(r.virtual)})" if r.virtual else "")
            for r in runs]
    for i, r in enumerate(runs):
        if labels and i < len(labels):
            r.label = labels[i]
        else:
            r.label = base[i] if base.count(base[i]) == 1 else f"{base[i]} ({r.path.name})"


def effective_window(window: int, lengths: list[int]) -> int:
    """``window`` capped to 1/WINDOWS_PER_CURVE of the shortest curve (at least 1): 400 minibatches
    over a 66-step run would be a cumulative mean, not a sliding window."""
    if not lengths:
        return window
    return max(1, min(window, min(lengths) // WINDOWS_PER_CURVE))


def time_unit(max_seconds: float) -> tuple[float, str]:
    """(divisor, name) so that the longest run reads naturally: seconds, minutes or hours."""
    if max_seconds >= 2 * 3600:
        return 3600.0, "hours"
    if max_seconds >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def collect(runs: list[RunData], window: int, merge: bool, target: float | None) -> PlotResult:
    """Every series to draw, in the chosen time unit, without drawing anything."""
    lengths = [n for n in (len(training_records(r, merge)) for r in runs) if n]
    res = PlotResult(paths=[], window=effective_window(window, lengths), window_asked=window,
                     shortest=min(lengths or [0]))
    curves = [(r, training_curve(r, res.window, merge), validation_curve(r)) for r in runs]
    longest = max([float(c[0].max()) for _, tr, va in curves for c in (tr, va) if len(c[0])] or [0.0])
    div, res.time_unit = time_unit(longest)
    for name in ("train_time", "train_epochs", "val_time", "val_epochs"):
        res.panels[name] = []
    for r, (tt, te, terr), (vt, ve, verr) in curves:
        if len(tt):
            res.panels["train_time"].append(Series(r.label, tt / div, terr))
            res.panels["train_epochs"].append(Series(r.label, te, terr))
        if len(vt):
            res.panels["val_time"].append(Series(r.label, vt / div, verr))
            res.panels["val_epochs"].append(Series(r.label, ve, verr))
        res.split[r.label] = time_split(r)
        if target is not None:
            res.reached[r.label] = time_to_targets(r.val, [target])[target_key(target)]
    return res


def _style_axis(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="major", alpha=0.35, linewidth=0.6)
    ax.set_ylim(0, 100)                    # error in %: the same frame for every figure
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlim(left=0)
    ax.tick_params(labelsize=9)


def train_title(res: PlotResult) -> str:
    """The training panels' title, with the window used (and why, when it was capped)."""
    title = f"training top-1 error, {res.window}-minibatch sliding window"
    if res.window < res.window_asked:
        title += (f"\n(window {res.window_asked} capped to 1/{WINDOWS_PER_CURVE} of the shortest run, "
                  f"{res.shortest} minibatches)")
    return title


def draw_curves(res: PlotResult, path: Path, target: float | None, dpi: int):
    """Figure 1: 2x2 panels, training (smoothed) and validation top-1 error against time and
    epochs; returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7.5), layout="constrained")
    FigureCanvasAgg(fig)                   # a renderer, to measure the legend (_fit_legend)
    axes = fig.subplots(2, 2, sharey="row")
    labels = list(dict.fromkeys(s.label for p in res.panels.values() for s in p))
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    tlabel = f"training time ({res.time_unit}, evaluation excluded)"
    spec = [("train_time", 0, 0, tlabel, train_title(res)),
            ("train_epochs", 0, 1, "epoch", train_title(res)),
            ("val_time", 1, 0, tlabel, "validation top-1 error"),
            ("val_epochs", 1, 1, "epoch", "validation top-1 error")]
    for name, i, j, xlabel, title in spec:
        ax, val = axes[i][j], name.startswith("val")
        for s in res.panels[name]:
            ax.plot(s.x, 100 * s.y, color=colors[s.label], label=s.label, linewidth=1.6,
                    marker="o" if val and len(s.x) <= 60 else None, markersize=3.5,
                    clip_on=False)         # a point at 0 or 100 % is drawn whole on the frame
        if target is not None and val:
            ax.axhline(100 * target, color="0.25", linestyle="--", linewidth=1.0,
                       label=f"target {100 * target:g}% (\u2605 first reached)")
        _style_axis(ax, xlabel, "top-1 error (%)" if j == 0 else "", title)
    _mark_targets(axes[1][0], axes[1][1], res, colors, target)
    handles, names = axes[1][0].get_legend_handles_labels()
    if not handles:
        handles, names = axes[0][0].get_legend_handles_labels()
    _fit_legend(fig, handles, names)
    fig.savefig(path, dpi=dpi)
    return fig


def _fit_legend(fig, handles, names) -> None:
    """The figure legend below the panels in as few rows as fit the figure's width (measured, so
    long labels such as ``gossip ×4 (RUN_DIR name)`` wrap to more rows instead of being clipped)."""
    renderer = fig.canvas.get_renderer()
    for ncols in range(min(len(names), 5), 0, -1):
        leg = fig.legend(handles, names, loc="outside lower center", ncols=ncols, fontsize=10,
                         frameon=False)
        if ncols == 1 or leg.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        leg.remove()


def _mark_targets(ax_time, ax_epochs, res: PlotResult, colors: dict, target: float | None) -> None:
    """A star where each run first reached the target validation error."""
    if target is None:
        return
    div = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0}[res.time_unit]
    for label, hit in res.reached.items():
        if hit is not None:
            kw = dict(marker="*", markersize=12, color=colors.get(label, "k"), markeredgecolor="k",
                      markeredgewidth=0.6, zorder=5)
            ax_time.plot([hit["train_seconds"] / div], [100 * hit["val_top1_error"]], **kw)
            ax_epochs.plot([hit["epoch"]], [100 * hit["val_top1_error"]], **kw)


def wrap_label(label: str) -> str:
    """A run label on lines of at most TICK_LABEL_CHARS characters, broken at spaces and hyphens
    only (a longer word keeps its own line; the slot width follows the longest line)."""
    lines = textwrap.wrap(label, TICK_LABEL_CHARS, break_on_hyphens=True, break_long_words=False)
    return "\n".join(lines) or label


def draw_split(res: PlotResult, path: Path, dpi: int):
    """Figure 2: per run, the mean worker's training time as stacked bars (compute/comm/wait/data);
    returns the Figure.  Each bar gets a slot wide enough for its wrapped label."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = list(res.split)
    totals = [sum(res.split[lab].values()) for lab in labels]
    div, unit = time_unit(max(totals or [0.0]))
    ticks = [wrap_label(lab) for lab in labels]
    longest = max((len(line) for t in ticks for line in t.split("\n")), default=0)
    slot = max(1.3, 0.08 * longest + 0.3)          # inches per bar: ~0.07 in per 9-pt character
    fig = Figure(figsize=(max(5.0, slot * len(labels) + 2.5), 4.8 + 0.15 * ticks_lines(ticks)),
                 layout="constrained")
    FigureCanvasAgg(fig)                   # a renderer for whoever measures the figure afterwards
    ax = fig.subplots()
    x, bottom = np.arange(len(labels)), np.zeros(len(labels))
    for kind in SPLIT_KINDS:
        h = np.array([res.split[lab][kind] for lab in labels]) / div
        ax.bar(x, h, 0.6, bottom=bottom, label=kind, color=SPLIT_COLORS[kind], edgecolor="white",
               linewidth=0.5)
        for xi, hi, b, tot in zip(x, h, bottom, totals):      # label segments tall enough to read
            if tot > 0 and hi * div >= 0.06 * max(totals):
                ax.text(xi, b + hi / 2, f"{100 * hi * div / tot:.0f}%", ha="center", va="center",
                        fontsize=8, color="white")
        bottom += h
    for xi, tot in zip(x, totals):
        ax.text(xi, tot / div, f"{tot / div:.3g} {unit[0] if unit != 'seconds' else 's'}", ha="center",
                va="bottom", fontsize=9)
    ax.margins(y=0.08)
    ax.set_xticks(x, ticks, fontsize=9)
    ax.set_ylabel(f"time per worker ({unit})")
    ax.set_title("where the training time goes (mean over workers)", fontsize=11)
    ax.grid(True, axis="y", alpha=0.35, linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    fig.savefig(path, dpi=dpi)
    return fig


def ticks_lines(ticks: list[str]) -> int:
    """Lines of the tallest wrapped tick label."""
    return max((t.count("\n") + 1 for t in ticks), default=1)


def split_path(out: str | Path) -> Path:
    """``fig.png`` -> ``fig_time.png`` (same directory and suffix)."""
    out = Path(out)
    return out.with_name(f"{out.stem}_time{out.suffix or '.png'}")


def plot_runs(run_dirs, out: str | Path, window: int = 400, target: float | None = None,
              merge: bool = False, labels: list[str] | None = None, dpi: int = 150) -> PlotResult:
    """Draws figure 1 at ``out`` and figure 2 at ``split_path(out)``; returns what it plotted."""
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    runs = [load_run(d) for d in run_dirs]
    assign_labels(runs, labels)
    res = collect(runs, window, merge, target)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res.figures = [draw_curves(res, out, target, dpi), draw_split(res, split_path(out), dpi)]
    res.paths = [out, split_path(out)]
    return res


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scalesgd-plot", description=__doc__.split("\n\n")[1])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (with metrics/)")
    p.add_argument("-o", "--output", default=None, help="figure 1 path; figure 2 is STEM_time.png "
                   "(default: RUN_fig.png next to the first RUN_DIR)")
    p.add_argument("--window", type=int, default=400, help="sliding window in minibatches (default 400; "
                   "capped at a quarter of the shortest run, the title says)")
    p.add_argument("--target", type=float, default=None,
                   help="target validation top-1 error as a fraction, e.g. 0.3: drawn and reported")
    p.add_argument("--merge-workers", action="store_true",
                   help="smooth over every worker's minibatches (ordered by training time) instead of "
                        "the first worker's")
    p.add_argument("--labels", default="", help="comma-separated legend labels, one per run")
    p.add_argument("--dpi", type=int, default=150)
    args = p.parse_args(argv)
    if args.window < 1:
        p.error(f"--window: must be >= 1, got {args.window}")
    if args.target is not None and not 0 < args.target < 1:
        p.error(f"--target: a top-1 error in (0, 1), got {args.target}")
    if args.output is None:
        args.output = str(default_output(args.runs[0]))
    return args


def default_output(first_run: str) -> Path:
    """``runs/A`` (or ``runs/A/``, or ``.`` inside it) -> ``runs/A_fig.png``, beside the run."""
    run = Path(first_run).resolve()
    return run.with_name(f"{run.name}_fig.png")


def report(res, target: float) -> str:
    """One line per run: when it first reached ``target`` validation error."""
    lines = []
    for label, hit in res.reached.items():
        if hit is None:
            lines.append(f"{label}: did not reach {100 * target:g}% validation top-1 error")
        else:
            lines.append(f"{label}: reached {100 * target:g}% after {hit['train_seconds'] / 3600:.3f} h "
                         f"({hit['train_seconds']:.1f} s) of training, epoch {hit['epoch']:.2f} "
                         f"(error {100 * hit['val_top1_error']:.2f}%)")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    try:
        res = plot_runs(args.runs, args.output, args.window, args.target, args.merge_workers, labels,
                        args.dpi)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"scalesgd-plot: error: {exc}", file=sys.stderr)
        return 1
    for path in res.paths:
        print(f"wrote {path}")
    if args.target is not None:
        print(report(res, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
