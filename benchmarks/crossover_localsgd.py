"""Local SGD in the crossover study, re-timed with the code that no longer makes its workers wait
for each other at every step.

The study's runs (its pinned commit) include local SGD as it was then: the stop and checkpoint
signals were merged by a tiny all-reduce after every step (the base class's lockstep rule), so every
step waited for the slowest worker, while the method only needs its workers together at an average,
every tau steps.  Under ``none`` that cost a latency per step; under ``typical`` noise and Jin's
stragglers it cost each step's slowest worker instead of each period's.  Now the signals travel with
the average (``methods/localsgd.py``).

Local SGD's arithmetic ignores the clock (a synchronous method: its errors at every sample count are
the study's, whatever the timing), so the study's own runs can be timed exactly with the code as it
is now: a clock-only virtual run (``virtual/clockonly.py``, what ``scalesgd plan`` uses) of each
cell's configuration and seed under the cell's network and condition, read at the study's own
validation errors as the study reads its records (``plan.to_target``).  Run with the code before the
fix (``--src`` a tree of it, ``--label check``), the same runs give the study's recorded seconds
bit for bit: the ``check`` entries.

For each cell the study's paired rule is then applied again with local SGD's new times (the other
methods' as recorded): the fastest method, the tied set and the family call, before and after.  The
tuning's choice of local SGD's settings is the study's (made with the old clock).

    PYTHONPATH=src python benchmarks/crossover_localsgd.py             # every cell (~30 min on 2 cores)
    python benchmarks/crossover_localsgd.py --src OLD/src --label check --only KEY ...

Writes ``results/crossover-localsgd.json``, after every cell, each cell with the commit of the code
that timed it (a rerun goes on where it stopped; a cell timed by other code is timed again; every
cell's calls are made again from the study's rows as they are now, which an open cell's runs change).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "crossover-localsgd.json"
STUDY = ROOT / "src" / "scalesgd" / "virtual" / "study" / "crossover.json"


def code_commit(src: Path) -> str:
    """The last commit that changed the code under ``src`` (stable while only results move: the
    study file ``plan`` reads lives under ``src`` too, and each piece of the study commits it)."""
    return subprocess.run(["git", "log", "-1", "--format=%H", "--", ".", ":(exclude)*/virtual/study/*"],
                          cwd=src, check=True, capture_output=True, text=True).stdout.strip()


def retime_cell(study: dict, key: str, seeds: list[str]) -> dict:
    """Seed -> seconds to the target of the cell's local SGD runs on the current code's clock."""
    from scalesgd.virtual import plan as L  # noqa: PLC0415  (from --src)
    from scalesgd.virtual import profile as P  # noqa: PLC0415
    net, cond, p = key.split("/")
    r = study["cells"][key]["methods"]["localsgd"]
    prof = P.load(net)
    out = {}
    for sd in seeds:
        v = r["seeds"][sd]
        pts = L.clock(study, r["flags"], int(p[1:]), prof, P.condition_of(prof, cond), int(sd),
                      max(x for x, _ in v["curve"]))
        out[sd] = L.to_target(v["curve"], pts, study["target_error"])
    return out


def judged(rows: dict) -> dict:
    """The study's calls on one cell's rows: fastest, tied set, the families."""
    import crossover_report as R  # noqa: PLC0415
    fastest, tied = R.rank_rows(rows)
    fam = R.family_call(rows)
    return dict(fastest=fastest, tied_set=[fastest, *tied] if fastest else [],
                family=fam and dict(first=fam["family"], sync=fam.get("other"), async_=fam.get("claim")))


def with_times(rows: dict, seconds: dict) -> dict:
    """The cell's rows with local SGD's seed times replaced by ``seconds``."""
    from statistics import mean  # noqa: PLC0415
    out = json.loads(json.dumps(rows))
    ls = out["localsgd"]
    for sd, t in seconds.items():
        ls["seeds"][sd]["seconds"] = t
    times = [v["seconds"] for v in ls["seeds"].values()]
    ls["mean_seconds"] = mean(times) if all(t is not None for t in times) else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the package tree to time with")
    ap.add_argument("--label", default="retimed", choices=("retimed", "check"))
    ap.add_argument("--only", nargs="*", default=None, help="cells (network/condition/pP); default all")
    ap.add_argument("--seeds", type=int, default=0, help="at most this many seeds a cell (0: all)")
    a = ap.parse_args(argv)
    sys.path[:0] = [str(a.src.resolve()), str(HERE)]
    study = json.loads(STUDY.read_text())
    res = json.loads(OUT.read_text()) if OUT.exists() else {"cells": {}}
    commit = code_commit(a.src)
    res["study_commits"] = study["commits"]
    keys = [k for k, c in study["cells"].items() if c["methods"].get("localsgd", {}).get("seeds")]
    for key in keys if a.only is None else [k for k in keys if k in a.only]:
        cell = res["cells"].setdefault(key, {})
        rows = study["cells"][key]["methods"]
        seeds = sorted(rows["localsgd"]["seeds"], key=int)[: a.seeds or None]
        have = cell.get(a.label, {}) if cell.get(f"{a.label}_code") == commit else {}   # (one code a cell)
        todo = [s for s in seeds if s not in have]
        t0 = time.perf_counter()
        if todo:
            have.update(retime_cell(study, key, todo))
        cell[a.label], cell[f"{a.label}_code"] = have, commit
        cell["recorded"] = {s: v["seconds"] for s, v in rows["localsgd"]["seeds"].items()}
        if a.label == "retimed" and set(have) == set(rows["localsgd"]["seeds"]):
            cell["before"] = judged(rows)            # judged again on every run: the other methods'
            cell["after"] = judged(with_times(rows, have))   # rows may have grown since (more seeds)
        save(res)
        if todo:
            print(f"{key}: {len(todo)} seeds in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def save(res: dict) -> None:
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    tmp.replace(OUT)


if __name__ == "__main__":
    sys.exit(main())
