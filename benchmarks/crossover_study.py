#!/usr/bin/env python3
"""The crossover study's command line (the study itself: the ``crossover`` package beside this).

    python benchmarks/crossover_study.py pin [COMMIT]        # the code every run of the study uses
    python benchmarks/crossover_study.py run [--minutes 55]  # one resumable piece (2 runs at a time)
    python benchmarks/crossover_study.py status              # what is done, what is left, the hours
    python benchmarks/crossover_study.py report [--final]    # the analysis, the figure, plan's file
    python benchmarks/crossover_study.py pack                # fold finished runs' records into packs
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crossover import driver, report, store, study


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("pin", "run", "status", "report", "pack"))
    ap.add_argument("commit", nargs="?", default="HEAD", help="pin: the commit (default HEAD)")
    ap.add_argument("--minutes", type=float, default=55.0, help="run: a piece's wall-time budget")
    ap.add_argument("--jobs", type=int, default=2, help="run: runs at a time (one core each)")
    ap.add_argument("--data", type=Path, default=study.ROOT / "data" / "glyphs",
                    help="run: the glyph data sets (built there on first use)")
    ap.add_argument("--scratch", type=Path, default=study.ROOT / "runs" / "crossover",
                    help="run: where runs write before their record is kept")
    ap.add_argument("--final", action="store_true",
                    help="report: write crossover.json (refused while runs are left); without it "
                    "crossover-progress.json (the figure, docs/figures/crossover.png, either way)")
    a = ap.parse_args(argv)
    if a.what == "pin":
        return driver.pin(a.commit)
    if a.what == "run":
        return driver.piece(a.minutes, a.jobs, a.data, a.scratch)
    if a.what == "report":
        return report.main(final=a.final)
    if a.what == "pack":
        for kind, n in store.pack(study.RESULTS).items():
            print(f"{kind}: {n} records in {kind}{store.PACKED}")
        return 0
    return driver.status()


if __name__ == "__main__":
    sys.exit(main())
