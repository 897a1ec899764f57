"""``plan --target final`` (the default): the methods ranked by time to final quality on a user's
cluster, from the map by time to final quality (``benchmarks/final_map.py``, shipped as
``study/final.json``).

The map trained every method over a full schedule of ``E`` epochs (a cosine decay after a warm-up)
on the crossover study's task, and judged each cell by the time to within δ = 1 point of its best
synchronous final error, F* + δ.  ``plan`` reads it for a user's profile as it reads the early
target's study (``plan.py``), with these differences:

* **cells**: the one-GPU-a-node networks' cells are flat agents; the eight-GPUs-a-node networks'
  cells were run as node agents (``--hierarchy node``).  The flat rows come from the flat network
  nearest to the user's balance at the bandwidth each rank gets, at the map's p nearest to the
  user's workers; on a profile of several ranks a node, the node rows from the node network nearest
  to a node agent's balance (the whole link, and the node's own sum), at the same p (the same GPUs
  and global batch, in the user's nodes: where the map has no node agents there, or p is not at
  least two whole nodes of the user's, none, said).  Push-sum ran under ``none`` and
  ``stragglers`` only: under ``typical`` (and any condition the map did not run) its statistics are
  those of ``none``, said;
* **the quality**: one for every row shown, F* + δ with F* the least synchronous mean final error
  among them (the errors are the map's: they do not depend on the clock);
* **time**: each method's seeds on the user's clock (clock-only runs: every seed of a synchronous
  method, exact, except local SGD as node agents in nodes of another size than the map's 8; one
  seed of push-sum, whose statistics are the map's on the nearest network), and
  then, as the map reads its cells, the seeds' mean curve's first time at the quality (linear
  between validations).  Also each method's mean final error and the time of its whole schedule;
* **a method that misses the quality** is ranked after those that reach it, with its final error,
  the time of its whole schedule and how that compares with the fastest synchronous method's time
  to the same error ("1.8x faster, 2 points worse" is an answer a user can choose);
* **how sure**: the share of resamples of the map's paired seeds in which the first row stays first
  (``first_share``: F* and every time redone in each), said under the ranking.

The map's budget is its proxy's 8 epochs, not a user's schedule: its gaps between methods overstate
longer schedules' (docs/results.md, section 14), which every answer says.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import ConfigError
from . import profile as P
from .studyfile import (SYNC, at, balance, clocks, condition_name, describe, nearest_p, task_config,
                        to_target, virtual_check)

FINAL = Path(__file__).parent / "study" / "final.json"


def is_final(study: dict) -> bool:
    return study.get("metric") == "final"


def mean_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The seeds' mean curve (x, error), validation by validation (the map's seeds share their
    validations; a diverged seed was carried at chance in the study file)."""
    n = min(len(c) for c in curves)
    return [(sum(c[i][0] for c in curves) / len(curves), sum(c[i][1] for c in curves) / len(curves))
            for i in range(n)]


def first(curve: list[tuple[float, float]], quality: float) -> float | None:
    """The first x at which ``curve`` (x, error) reaches ``quality``, linear between the validation
    before and the first at or below it (``studyfile.to_target``, the map's ``first_times``)."""
    return to_target([[i, e] for i, (_, e) in enumerate(curve)], [(i, x) for i, (x, _) in enumerate(curve)],
                     quality)


RESAMPLES = 1000                     # of the map's seeds, for how sure the first place is


def first_share(rows: list[dict], delta: float, resamples: int = RESAMPLES, seed: int = 0) -> float | None:
    """How sure the ranking's first place is: the share of resamples of the seeds (with replacement,
    the same seed indices for every row: the map's seeds are paired) in which the row first by the
    seeds' means, ``rows[0]``, is still first, F* (the least synchronous mean final error), every
    mean curve and its time to F* + ``delta`` redone in each.  ``rows``: each with ``method`` and
    ``runs`` (per seed, validations as (samples, seconds, error)), in the ranking's order; None when
    there is no other row (``predict_final`` asks only where the first row reaches the quality)."""
    import numpy as np  # noqa: PLC0415
    if len(rows) < 2:
        return None
    n = min(len(r["runs"]) for r in rows)
    curves = [[[(s, e) for _, s, e in run] for run in r["runs"][:n]] for r in rows]
    rng = np.random.default_rng(seed)
    kept = 0
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        means = [mean_curve([c[i] for i in idx]) for c in curves]
        quality = min(m[-1][1] for m, r in zip(means, rows) if r["method"] in SYNC) + delta
        reached = [(t, k) for k, m in enumerate(means) if (t := first(m, quality)) is not None]
        kept += bool(reached) and min(reached)[1] == 0
    return kept / resamples


def cells_at(study: dict, net: str, cond: str) -> list[int]:
    return sorted({int(k.rsplit("/p", 1)[1]) for k in study["cells"] if k.startswith(f"{net}/{cond}/p")})


def choose_p(study: dict, net: str, cond: str, workers: int, notes: list, what: str) -> int | None:
    """The map's p for ``workers`` on ``net``: the nearest (log2) of those it plans for the net's
    kind of agents (``study["p"]``), or, while it runs, the nearest with results (said); far beyond
    its largest, said."""
    have = cells_at(study, net, cond)
    if not have:
        return None
    planned = nearest_p(study["p"][study["agents"][net]], workers)
    p = planned if planned in have else nearest_p(have, workers)
    if p != planned:
        notes.append(f"{what}: p = {planned}, the map's nearest to your {workers} workers, has no results "
                     f"yet (the map is still running): its p = {p}, the nearest with results")
    elif p != workers:
        notes.append(f"{what}: the map ran p = {p}, the nearest to your {workers} workers")
    if workers > 2 * max(have):
        notes.append(f"{what}: {workers} workers lie far beyond the largest p the map has ({max(have)}): "
                     f"its ranking at p = {max(have)}, an extrapolation")
    return p


def cell_rows(study: dict, net: str, cond: str, p: int) -> tuple[dict, str | None]:
    """The map's methods at ``net`` / ``cond`` / ``p``: the cell's own, and push-sum's from ``none``
    where the cell has none (the map ran it under ``none`` and ``stragglers`` only; ``typical`` made
    the same family call as ``none`` in the early-target study); with a note where it did."""
    methods = dict(study["cells"][f"{net}/{cond}/p{p}"]["methods"])
    other = study["cells"].get(f"{net}/none/p{p}", {}).get("methods", {})
    borrowed = {m: r for m, r in other.items() if m not in SYNC and m not in methods}
    methods.update(borrowed)
    note = (f"{', '.join(sorted(borrowed))} ran under none and stragglers only: its statistics under {cond} "
            f"are those of none on {net} (its clock is yours)" if borrowed else None)
    if all(m in SYNC for m in methods):
        note = (f"push-sum has no results on {net} at p = {p} yet (the map ran it under none and stragglers "
                "only, and is still running): the synchronous methods alone")
    return methods, note


def timed(study: dict, methods: dict, agents: str, p: int, prof: P.Profile, yours, net: str, cond: str,
          say, procs: int | None = None) -> list[dict]:
    """Each of ``methods`` (one cell's) on ``prof``'s clock: per seed (validation samples, seconds,
    error).  A synchronous method's seeds are its own on your clock, exactly, except local SGD as node
    agents in nodes of another size than the map's (more or fewer replicas: its statistics are the
    map's); all-reduce as node agents sums the same gradients in any grouping.  The clock-only runs
    go ``procs`` at a time (``clocks``)."""
    node = agents == "node"
    same = not node or int(prof.ranks_per_node) == P.load(net).ranks_per_node
    jobs = []
    for m, r in methods.items():
        sync = m in SYNC
        say(f"timing {m}{' as node agents' if node else ''} on {prof.name} "
            f"({'each seed' if sync else 'one seed'}, clock only)")
        seeds = r["seeds"]
        end = max(x for v in seeds.values() for x, _ in v["curve"])
        jobs += [(r["flags"], p, int(sd), end) for sd in (seeds if sync else list(seeds)[:1])]
    got = iter(clocks(study, prof, yours, jobs, procs))
    out = []
    for m, r in methods.items():
        sync = m in SYNC
        seeds = r["seeds"]
        if sync:                          # the map's errors on your clock, each seed's own
            runs = []
            for v in seeds.values():
                pts = dict(next(got))
                runs.append([(x, pts[x], e) for x, e in v["curve"]])
        else:                             # the map's statistics on your clock (one seed's)
            pts = next(got)
            runs = [[(x, at(pts, x), e) for x, e in v["curve"]] for v in seeds.values()]
        exact = sync and (m == "allreduce" or same)
        timing = ("exact (re-timed)" if exact else f"statistics of {net} / {cond}") + \
            (", node agents" if node else "")
        out.append(dict(method=m, agents="node" if node else "rank", config=r["config"], flags=r["flags"],
                        settings=describe(m, r["config"], r["flags"]), seeds=len(seeds), runs=runs,
                        final_error=r["final_error"], timing=timing, network=net, p=p))
    return out


def predict_final(study: dict, prof: P.Profile, workers: int, condition: str | None = None,
                  say=lambda msg: None, procs: int | None = None) -> dict | str:
    """The ranking by time to final quality for ``workers`` workers on ``prof`` (the module
    docstring); where the map cannot give one, why (one worker: no method to choose; no cell for
    the user's network and condition yet; no synchronous result in it)."""
    if workers < 1:
        raise ConfigError(f"--workers: at least 1, got {workers}")
    cond, cond_note = condition_name(prof, condition)
    if workers == 1:
        return "the map by time to final quality has no runs of one worker (nothing to choose between)"
    yours = P.condition_of(prof, condition)
    cfg = task_config(study)
    kinds = study["agents"]
    flat = {n: balance(P.load(n), study, cfg) for n in study["networks"] if kinds[n] == "flat"}
    nodes = {n: balance(P.load(n), study, cfg, agents="node")
             for n in study["networks"] if kinds[n] == "node"}

    def nearest(nets, ratio):
        return min(nets, key=lambda n: abs(math.log(nets[n]["ratio"]) - math.log(ratio)))
    mine = balance(prof, study, cfg)
    net = nearest(flat, mine["ratio"])
    notes = []
    p = choose_p(study, net, cond, workers, notes, "flat")
    if p is None:
        return (f"the map by time to final quality has no results for your network ({net}, the nearest) "
                f"and condition ({cond}) yet")
    methods, borrowed = cell_rows(study, net, cond, p)
    rows = timed(study, methods, "flat", p, prof, yours, net, cond, say, procs)
    node = None
    rpn = int(prof.ranks_per_node)
    if rpn > 1 and nodes:
        # node agents at the flat rows' p, in your nodes: the same GPUs and global batch in one ranking
        agent = balance(prof, study, cfg, agents="node")
        nnet = nearest(nodes, agent["ratio"])
        size = P.load(nnet).ranks_per_node
        have = cells_at(study, nnet, cond)
        there = f" (it has p = {', '.join(map(str, have))})" if have else " yet"
        why = (f"p = {p} is fewer than two of your nodes" if p < 2 * rpn else
               f"p = {p} is not a whole number of your nodes of {rpn}" if p % rpn else
               f"the map has no node agents at p = {p} on {nnet} under {cond}{there}" if p not in have
               else None)
        if why:
            notes.append(f"your profile puts {rpn} ranks on a node, but {why}: only flat agents are timed")
        else:
            node = dict(network=nnet, ratio=agent["ratio"], network_ratio=nodes[nnet]["ratio"],
                        nodes=p // rpn, your_nodes=workers // rpn, p=p, node_size=size)
            nmethods, nborrowed = cell_rows(study, nnet, cond, p)
            rows += timed(study, nmethods, "node", p, prof, yours, nnet, cond, say, procs)
            borrowed = borrowed or nborrowed
            notes.append(f"your profile puts {rpn} ranks on a node: every method is timed both flat (one "
                         "agent a rank, the node's link shared) and as node agents (--hierarchy node: "
                         f"{p // rpn} of your nodes at p = {p}); the node agents' statistics are the map's "
                         f"on {nnet} at p = {p} ({p // size} nodes of {size})"
                         + ("" if size == rpn else f": exact for all-reduce only, your nodes holding {rpn}"))
    if borrowed:
        notes.append(borrowed)
    if cond_note:
        notes.append(cond_note + " (push-sum's statistics; every clock is your condition's)")
    if not any(r["method"] in SYNC for r in rows):
        return f"the map's cell {net}/{cond}/p{p} has no synchronous result (every seed diverged)"
    fstar = min(r["final_error"] for r in rows if r["method"] in SYNC)
    quality = fstar + study["delta"]
    for r in rows:
        mean = mean_curve([[(t, e) for _, t, e in run] for run in r["runs"]])
        r["to_quality"] = first(mean, quality)
        per = [first([(t, e) for _, t, e in run], quality) for run in r["runs"]]
        r["reached"] = sum(t is not None for t in per)
        got = [t for t in per if t is not None]
        r["lo"], r["hi"] = (min(got), max(got)) if got else (None, None)
        r["end"] = mean[-1][0]
        r["mean"] = mean
    sync = [r for r in rows if r["method"] in SYNC and r["to_quality"] is not None]
    best_sync = min(sync, key=lambda r: r["to_quality"], default=None)
    for r in rows:
        if r["to_quality"] is None and best_sync is not None:
            t = first(best_sync["mean"], r["final_error"])
            r["gap"] = r["final_error"] - best_sync["final_error"]
            r["vs"] = dict(method=best_sync["method"], agents=best_sync["agents"], seconds=t,
                           ratio=None if not t else r["end"] / t)
    rows.sort(key=lambda x: (x["to_quality"] is None, x["to_quality"] or 0.0, x["final_error"], x["agents"]))
    sure = first_share(rows, study["delta"]) if rows[0]["to_quality"] is not None else None
    for r in rows:
        del r["mean"], r["runs"]
    return dict(metric="final", fallback=None, workers=workers, p=p, network=net, condition=cond,
                ratio=mine["ratio"], network_ratio=flat[net]["ratio"], notes=notes, rows=rows,
                node_agents=node,
                ranks_per_node=rpn, fstar=fstar, quality=quality, delta=study["delta"], E=study["E"],
                first_share=sure, resamples=RESAMPLES,
                schedule=study["task"].get("schedule"), complete=study.get("complete", False),
                task=study["task"].get("name", "the study's task"))


def secs(x: float) -> str:
    return f"{x:.4g}"


def show_final(res: dict, prof: P.Profile) -> str:
    out = [f"plan: {res['workers']} worker{'s' if res['workers'] != 1 else ''} on {prof.name}: time to final "
           f"quality (within {res['delta'] * 100:g} point of the best synchronous final error, "
           f"{res['fstar']:.2%}: to {res['quality']:.2%} top-1 error) on the map's task ({res['task']}, "
           f"{res['schedule']}), predicted from the map by time to final quality"]
    out.append(f"  nearest mapped network: {res['network']} (communication / compute "
               f"{res['network_ratio']:.3g}; yours {res['ratio']:.3g}), condition {res['condition']}; every "
               "time is on your profile's clock (exact for all-reduce and local SGD; push-sum's statistics "
               "are that network's)")
    node = res.get("node_agents")
    if node:
        out.append(f"  as node agents (at p = {node['p']}: {node['nodes']} of your nodes of "
                   f"{res['ranks_per_node']}; you have {node['your_nodes']}): nearest mapped network "
                   f"{node['network']} (communication / compute {node['network_ratio']:.3g}; a node agent's "
                   f"{node['ratio']:.3g}: the whole link, and the node's own sum)")
    for n in res["notes"]:
        out.append(f"  note: {n}")
    out.append(f"  note: the map's budget is its proxy's {res['E']} epochs, not your schedule: its gaps "
               "between methods overstate those of longer schedules (docs/results.md, section 14)")
    if not res["complete"]:
        out.append("  note: the map is still running: p, networks or conditions it has not finished are "
                   "missing")
    table = []
    for i, r in enumerate(res["rows"], 1):
        if r["to_quality"] is not None:
            t = f"{secs(r['to_quality'])} ({r['reached']}/{r['seeds']} seeds reach it)"
            rank = str(i)
        else:
            v = r.get("vs") or {}
            them = f"{v['method']} ({v['agents']})" if node and v else v.get("method")
            cmp = f"; {v['ratio']:.2f}x the time {them} takes to that error" if v.get("ratio") else ""
            t = f"misses: {r['gap'] * 100:+.1f} points{cmp}" if "gap" in r else "misses"
            rank = "-"
        who = f"{r['method']} ({r['agents']})" if node else r["method"]
        table.append((rank, who, t, f"{r['final_error']:.2%}", secs(r["end"]), r["settings"]))
    head = ("rank", "method (agents)" if node else "method", "time to quality (s)", "final error",
            "schedule (s)", "settings")
    wide = [max(len(row[k]) for row in [head, *table]) for k in range(5)]
    for row in [head, *table]:
        out.append(f"  {row[0]:{wide[0]}s} {row[1]:{wide[1]}s} {row[2]:>{wide[2]}s} {row[3]:>{wide[3]}s} "
                   f"{row[4]:>{wide[4]}s}  {row[5]}")
    best = res["rows"][0]
    if res.get("first_share") is not None:
        name = f"{best['method']} ({best['agents']})" if node else best["method"]
        share = res["first_share"]
        out.append(f"  sure: {name} is first in {share:.0%} of {res['resamples']} resamples of the map's "
                   f"seeds (F* and every time redone in each)"
                   + ("" if share >= 0.95 else ": the first place is not told apart from the next by the "
                      "map's seeds"))
    if best["to_quality"] is not None:
        who = f"{res['workers']} workers"
        if best["agents"] == "node":
            who += (f"; node agents: keep each node's {res['ranks_per_node']} ranks together (consecutive "
                    "ranks, mpirun's and srun's default block placement)")
        out.append(f"  use: mpirun -n {res['workers']} python -m scalesgd {best['flags']} --epochs N  "
                   f"({who}; the map's rate is for a batch of 8 per worker: scale it to yours; N your "
                   "schedule's epochs; add your job's --config or --data and your launcher)")
    return "\n".join(out)


def check_final(study: dict, res: dict, prof_spec: str, data: Path, top: int = 2,
                condition: str | None = None) -> list[dict]:
    """``--run`` for time to final quality: the ``top`` fastest predicted methods in the virtual
    cluster under the profile itself and the prediction's condition, at their p, one seed each, over
    the map's whole schedule (``E`` epochs) on its task; the time its curve takes to the quality,
    measured against predicted.  Each run gets a new directory under runs/."""
    import json  # noqa: PLC0415

    out = []
    for r in [x for x in res["rows"] if x["to_quality"] is not None][:top]:
        run_dir = virtual_check(study, r, r["p"], prof_spec, data, condition, str(study["E"]), [])
        rows = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()]
        curve = [(v["train_seconds"], 1 - v["val_top1_accuracy"]) for v in rows if v["kind"] == "val"]
        out.append(dict(method=r["method"], agents=r["agents"], predicted=r["to_quality"],
                        measured=first(curve, res["quality"]), error=curve[-1][1] if curve else None,
                        run_dir=str(run_dir)))
    return out
