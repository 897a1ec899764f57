"""``python -m scalesgd.plot RUN_DIR [RUN_DIR ...] -o fig.png`` (also ``scalesgd-plot``).

Writes ``fig.png`` (training and validation top-1 error against training time and epochs, one
line per run) and ``fig_time.png`` (the time split per run); with ``--target`` prints when each
run first reached that validation error.  Without ``-o`` the figures go next to the first run
directory: ``runs/A`` -> ``runs/A_fig.png`` and ``runs/A_fig_time.png``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .io.plot import plot_runs


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
