"""``python -m scalesgd plan --profile my-cluster.json --workers 64``: which method to use.  By
default by time to final quality, from the map of that name (``planfinal.py``); with ``--target
ERR`` (this module) by time to a target error, from the crossover study, as below; ``rank`` picks.

The study (``benchmarks/crossover/``) tuned every method the same way and timed each to
a target error at p = 1..128 under three networks (the papers' era, a current InfiniBand cluster,
10 Gbit/s Ethernet) and three conditions (no variability, a typical cluster's, Jin et al.'s
stragglers); its per-seed results ship as ``study/crossover.json`` (written by
``python benchmarks/crossover_study.py report``).  ``plan`` reads them for a user's profile:

* **p**: the studied worker count nearest to ``--workers`` (in log2; said when it differs); while
  the study runs, the nearest one with results on that network and condition (said);
* **network**: the studied one whose ratio of communication to compute is nearest to the
  profile's, for the study's task timed as the profile times it (one gradient's bytes over the
  link, plus the latency, against one step's compute);
* **condition**: ``--condition`` (or the profile's ``variability``) when it is one the study ran,
  else ``typical`` (said);
* **time**: every method's configuration (the one the study tuned it to on that network) is run
  on the user's profile and condition as a *clock-only* virtual run (``clockonly.py``: the real
  run's clock to the bit, without its arithmetic, seconds at most).  All-reduce, local SGD and one
  worker then take the study's own validation errors per seed on that clock: exact, since their
  arithmetic does not depend on the clock (``tests/test_plan.py`` checks against re-timed real
  runs).  The asynchronous methods take the samples to target the study measured on the nearest
  network and condition, on the user's clock: their timing is exact, their statistics the nearest
  studied ones (said).

* **agents**: on a profile of several ranks a node, every method is timed both flat and as node
  agents (``--hierarchy node``; the settings and statistics of the studied network nearest to a node
  agent's balance, from the study's flat runs: said);

It prints the methods ranked by predicted time to target (mean and range over the seeds, whether
the study found it tied with the fastest), the settings to use, and the methods that missed the
target in a seed, with the error they reached, or whose runs the study *stopped at the cap* (an
asynchronous method's runs end at twice the fastest synchronous time of the cell, since it cannot
be the fastest past that: not a missed target; the seeds' ``stopped``, where the study file has
it).  ``--run`` then checks the two fastest in the virtual cluster under the profile itself and
the prediction's condition, at its p: one seed each, to the target (or 12 epochs), on the study's
task (``--data``: the glyphs, ``python benchmarks/glyphs.py data/glyphs``); with ``--json`` the
checks join the JSON (key ``checks``).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

from ..errors import ConfigError, UserError
from . import profile as P
from .planfinal import FINAL, check_final, is_final, predict_final, show_final
from .studyfile import (STUDY, SYNC, at, balance, clocks, condition_name, describe, flag_value, load_study,
                        nearest_p, samples_to, task_config, to_target, virtual_check)


def method_rows(study: dict, cell: dict, p: int, prof: P.Profile, yours, target: float, net: str,
                cond: str, node: bool, say, procs: int | None = None) -> list[dict]:
    """Each method of ``cell`` timed on ``prof``'s clock at ``p`` (see the module docstring); with
    ``node``, as node agents (``--hierarchy node`` added to its flags), on the statistics of the
    study's flat runs: exact for all-reduce (the two-level sum adds the same gradients), the study's
    nearest for the others (a node's ranks averaging every step train unlike ``p`` flat agents).  The
    clock-only runs go ``procs`` at a time (``studyfile.clocks``)."""
    methods = (cell or {}).get("methods", {})
    own = target == study["target_error"]
    jobs, need = [], {}
    for m, r in methods.items():
        seeds = r["seeds"]
        sync = m in SYNC
        flags = r["flags"] + (" --hierarchy node" if node else "")
        say(f"timing {m}{' as node agents' if node else ''} on {prof.name} "
            f"({'each seed' if sync else 'one seed'}, clock only)")
        if sync:                          # the study's errors on your profile's clock
            jobs += [(flags, p, int(sd), max(x for x, _ in v["curve"])) for sd, v in seeds.items()]
        else:                             # the nearest studied statistics on your profile's clock
            need[m] = [v["samples"] if own else samples_to(v["curve"], target) for v in seeds.values()]
            got = [x for x in need[m] if x is not None]
            jobs += [(flags, p, int(next(iter(seeds))), max(got))] if got else []
    clocked = iter(clocks(study, prof, yours, jobs, procs))
    rows = []
    for m, r in methods.items():
        seeds = r["seeds"]
        sync = m in SYNC
        flags = r["flags"] + (" --hierarchy node" if node else "")
        if sync:
            times = [to_target(v["curve"], next(clocked), target) for v in seeds.values()]
        elif any(x is not None for x in need[m]):
            pts = next(clocked)
            times = [None if x is None else at(pts, x) for x in need[m]]
        else:
            times = [None] * len(seeds)
        got = [t for t in times if t is not None]
        reached = len(got) == len(seeds)
        # why the seeds that did not reach the target ended (a study file without it: None)
        why = [v.get("stopped") for v, t in zip(seeds.values(), times) if t is None]
        capped = (None if any("stopped" not in v for v in seeds.values())
                  else sum(v["stopped"] == "cap" for v in seeds.values()))
        if m == "allreduce" or (sync and not node):
            timing = "exact (re-timed)"
        elif sync:
            timing = f"statistics of flat ranks (the study's runs at p = {p})"
        else:
            timing = f"statistics of {net} / {cond}" + (", flat ranks" if node else "")
        rows.append(dict(method=m, agents="node" if node else "rank", config=r["config"], flags=flags,
                         settings=describe(m, r["config"], flags), seeds=len(seeds),
                         reached=len(got), mean_seconds=sum(got) / len(got) if reached else None,
                         lo=min(got) if reached else None, hi=max(got) if reached else None,
                         final_error=r["final_error"],
                         tied=target == study["target_error"] and m in cell.get("tied_set", []),
                         timing=timing, network=net, capped=capped,
                         stopped_at_cap=bool(why) and all(w == "cap" for w in why)))
    return rows


def target_of(study: dict, spec) -> float:
    """The error ``--target`` asks for (None: the study's own).  The study's runs end at its target
    (a validation at or below it), so a lower error is not in them (time to final quality is
    ``planfinal``'s, from the map's file)."""
    own = study["target_error"]
    if spec is None:
        return own
    if str(spec) == "final":
        raise ConfigError("--target final: time to final quality is read from the map by time to final "
                          f"quality's file, not the crossover study's; --target {own:g} or a higher "
                          "error here")
    try:
        t = float(spec)
    except ValueError:
        raise ConfigError(f"--target: 'final' or a top-1 error between 0 and 1, got {spec!r}") from None
    if not 0 < t < 1:
        raise ConfigError(f"--target: a top-1 error between 0 and 1, got {spec!r}")
    if t < own:
        raise ConfigError(f"--target {spec}: the study's runs stop at its target, {own:g} top-1 error, so "
                          f"they hold no time to {t:g}; {own:g} or above")
    return t


def predict(study: dict, prof: P.Profile, workers: int, condition: str | None = None,
            say=lambda msg: None, target=None, procs: int | None = None) -> dict:
    """The ranked prediction for ``workers`` workers on ``prof`` (see the module docstring), by
    time to ``target`` (``target_of``: None is the study's own)."""
    if workers < 1:
        raise ConfigError(f"--workers: at least 1, got {workers}")
    goal = target_of(study, target)
    cond, cond_note = condition_name(prof, condition)
    yours = P.condition_of(prof, condition)
    cfg = task_config(study)
    mine = balance(prof, study, cfg)
    nets = {n: balance(P.load(n), study, cfg) for n in study["networks"]}

    def nearest(ratio):
        return min(nets, key=lambda n: abs(math.log(nets[n]["ratio"]) - math.log(ratio)))
    net = nearest(mine["ratio"])
    have = sorted({int(k.rsplit("/p", 1)[1]) for k in study["cells"] if k.startswith(f"{net}/{cond}/p")})
    planned = nearest_p(study["workers"], workers) if workers > 1 else 1
    # while the study runs, the nearest p > 1 it has results for (a p it has not reached yet is said)
    several = [q for q in have if q > 1]
    p = planned if workers == 1 or planned in have or not several else nearest_p(several, workers)
    key = f"{net}/{cond}/p{p}"
    cell = study["cells"].get(key)
    notes = []
    if p != planned:
        notes.append(f"p = {planned}, the study's nearest to your {workers} workers, has no results there "
                     f"yet (the study is still running): the ranking is the study's at p = {p}, the nearest "
                     "p with results")
    elif p != workers:
        notes.append(f"the study ran p = {p}, the nearest to your {workers} workers")
    studied = several if p != planned else [q for q in study["workers"] if q > 1]
    if studied and workers > 2 * max(studied):
        notes.append(f"{workers} workers lie far beyond the largest p studied ({max(studied)}): the ranking "
                     f"is the study's at p = {max(studied)}, an extrapolation")
    if cond_note:
        notes.append(cond_note + " (the asynchronous methods' statistics; every clock is your condition's)")
    lo, hi = min(v["ratio"] for v in nets.values()), max(v["ratio"] for v in nets.values())
    if not lo / 2 <= mine["ratio"] <= 2 * hi:
        why = ("a profile without stands_for times the study's small model as itself: "
               "docs/virtual.md#profiles" if prof.stands_for is None else
               f"your {prof.ranks_per_node} ranks a node share its link: the node agents' balance is "
               "on its own line" if prof.ranks_per_node > 1 else "your network against your GPUs")
        notes.append(f"your ratio of communication to compute ({mine['ratio']:.3g}) lies outside the studied "
                     f"{lo:.3g}-{hi:.3g}: the asynchronous methods' statistics are an extrapolation ({why})")
    if cell and not cell.get("complete", True):
        still = ", ".join(cell.get("missing", [])) or "more tuning or the extra seeds of the close methods"
        notes.append(f"the study's cell {key} is not complete yet (still to run: {still}): "
                     "the ranking below may change")
    target = goal
    if goal != study["target_error"]:
        notes.append(f"time to {goal:.0%} error, not the study's own target ({study['target_error']:.0%}): "
                     "read from the same runs' validations (each method's settings and the ties are the "
                     "study's at its own target: none is marked here)")
    rows = method_rows(study, cell, p, prof, yours, target, net, cond, False, say, procs)
    node = None
    rpn = int(prof.ranks_per_node)
    if rpn > 1 and p >= 2 * rpn and p % rpn == 0:
        # node agents (--hierarchy node): the node's ranks sum inside the node, the node is the agent
        agent = balance(prof, study, cfg, agents="node")
        nnet = nearest(agent["ratio"])
        nkey = f"{nnet}/{cond}/p{p}"
        ncell = study["cells"].get(nkey)
        node = dict(network=nnet, cell=nkey, ratio=agent["ratio"], network_ratio=nets[nnet]["ratio"],
                    nodes=p // rpn, missing=ncell is None)
        rows += method_rows(study, ncell, p, prof, yours, target, nnet, cond, True, say, procs)
        notes.append(f"your profile puts {rpn} ranks on a node: every method is timed both flat (one agent "
                     f"a rank, the node's link shared) and as node agents (--hierarchy node: {p // rpn} "
                     f"agents, each node's ranks summing inside it), on your clock; the study ran one rank a "
                     f"node, so the node agents' statistics are its flat runs at p = {p} on {nnet}, the "
                     "network nearest to a node agent's balance (exact for all-reduce only)")
    elif rpn > 1:
        notes.append(f"your profile puts {rpn} ranks on a node: at p = {p} there are "
                     + ("fewer than two nodes" if p < 2 * rpn else "no whole nodes")
                     + ", so only flat agents are timed; the study ran one rank a node")
    rows.sort(key=lambda x: (x["mean_seconds"] is None, x["mean_seconds"] or 0, x["final_error"],
                             x["agents"]))
    return dict(metric="target", workers=workers, p=p, network=net, condition=cond, cell=key, studied_p=have,
                ratio=mine["ratio"], network_ratio=nets[net]["ratio"], notes=notes, rows=rows,
                node_agents=node, ranks_per_node=rpn,
                complete=study.get("complete", False), target_error=target,
                study_target=study["target_error"],
                missing=cell is None, cell_complete=bool(cell) and cell.get("complete", True),
                task=study.get("task", {}).get("name", "the study's task"))


def show(res: dict, prof: P.Profile) -> str:
    out = [f"plan: {res['workers']} worker{'s' if res['workers'] != 1 else ''} on {prof.name}: "
           f"time to {res['target_error']:.0%} top-1 error "
           f"on the study's task (the glyphs, ResNet-8), predicted from the crossover study"]
    out.append(f"  nearest studied network: {res['network']} (communication / compute "
               f"{res['network_ratio']:.3g}; yours {res['ratio']:.3g}), condition {res['condition']}: the "
               "settings each method was tuned to there; every time is a run on your profile's clock "
               "(exact for all-reduce, local SGD and one worker; the asynchronous methods' samples to "
               "target are that network's)")
    node = res.get("node_agents")
    if node:
        out.append(f"  as node agents ({node['nodes']} nodes of {res['ranks_per_node']}): nearest studied "
                   f"network {node['network']} (communication / compute {node['network_ratio']:.3g}; a node "
                   f"agent's {node['ratio']:.3g}: the whole link, and the node's own sum)"
                   + (f"; the study has no results for {node['cell']} yet" if node["missing"] else ""))
    for n in res["notes"]:
        out.append(f"  note: {n}")
    if not res["complete"]:
        if res["missing"] or not res["cell_complete"]:
            out.append("  note: the study is not complete yet: methods or p it has not run are missing below")
        else:
            out.append(f"  note: the study is still running, but its cell {res['cell']} is complete: every "
                       "method and seed below is in")
    if res["missing"] or not res["rows"]:
        have = ", ".join(map(str, res.get("studied_p", []))) or "none"
        out.append(f"  the study has no results for {res['cell']} yet (p with results there so far: {have}; "
                   "--workers one of them, or wait for the complete study)")
        return "\n".join(out)
    table = []
    for i, r in enumerate(res["rows"], 1):
        if r["mean_seconds"] is None:
            t = (f"{'stopped at the cap' if r.get('stopped_at_cap') else 'missed'} "
                 f"({r['reached']}/{r['seeds']} seeds; error {r['final_error']:.0%})")
            rank = "-"
        else:
            t = f"{r['mean_seconds']:.4g} [{r['lo']:.4g}-{r['hi']:.4g}] ({r['seeds']} seeds)"
            rank = str(i)
        # (the fastest method's other form is not "tied" with it: the ties are between methods)
        tie = ("  (tied with the fastest)" if r["tied"] and i > 1 and r["method"] != res["rows"][0]["method"]
               else "")
        who = f"{r['method']} ({r['agents']})" if node else r["method"]
        table.append((rank, who, t, r["settings"] + tie))
    head = ("rank", "method (agents)" if node else "method", "time to target (s)", "settings")
    wide = [max(len(row[k]) for row in [head, *table]) for k in range(3)]
    for rank, m, t, settings in [head, *table]:
        out.append(f"  {rank:{wide[0]}s} {m:{wide[1]}s} {t:>{wide[2]}s}  {settings}")
    short = [r for r in res["rows"] if r["mean_seconds"] is None]
    if any(not r.get("stopped_at_cap") for r in short):
        out.append("  missed: not at the target in every seed by the end of the study's runs, with the "
                   "mean error reached" + ("" if all(r.get("capped") is not None for r in short) else
                                           " (an asynchronous run stops once it cannot be the fastest: at "
                                           "twice the fastest synchronous method's time)"))
    if any(r.get("stopped_at_cap") for r in short):
        out.append("  stopped at the cap: the study stopped the method's runs once it could not be the "
                   "fastest, at twice the fastest synchronous method's time in its cell, with the mean "
                   "error reached there: slower than that, not a missed target")
    best = res["rows"][0]
    if best["mean_seconds"] is not None:
        servers = (int(flag_value(best["flags"], "--servers") or 0) if best["method"] in ("easgd", "asgd")
                   else 0)
        ranks = res["workers"] + servers
        who = f"{res['workers']} workers" + (f" + {servers} server rank{'s' if servers > 1 else ''}"
                                             if servers else "")
        if best.get("agents") == "node":
            who += (f"; node agents: keep each node's {res['ranks_per_node']} ranks together (consecutive "
                    "ranks, mpirun's and srun's default block placement)")
        out.append(f"  use: mpirun -n {ranks} python -m scalesgd {best['flags']}  ({who}; the study's "
                   "rate is for a batch of 8 per worker: scale it to yours; add your job's --config or "
                   "--data and your launcher)")
    return "\n".join(out)


def check(study: dict, res: dict, prof_spec: str, data: Path, top: int = 2,
          condition: str | None = None) -> list[dict]:
    """``--run``: the ``top`` fastest predicted methods in the virtual cluster under the profile
    itself and the condition the prediction's clocks used (``condition``, as given to ``predict``:
    None is the profile's own), at the prediction's p, one seed each, to the target or 12 epochs,
    on the study's task; measured against predicted.  Each run gets a new directory under runs/."""
    out = []
    for r in [x for x in res["rows"] if x["mean_seconds"] is not None][:top]:
        run_dir = virtual_check(study, r, res["p"], prof_spec, data, condition, "12",
                                ["--stop-at-error", str(res["target_error"])])
        s = json.loads((run_dir / "summary.json").read_text())
        hit = s.get("stopped_at_error")
        out.append(dict(method=r["method"], predicted=r["mean_seconds"],
                        measured=s["train_seconds"] if hit else None,
                        error=1 - s["val_top1_accuracy"], run_dir=str(run_dir)))
    return out


def rank(a, prof: P.Profile, say) -> tuple[dict, dict, bool]:
    """(the study read, the prediction, whether it is by time to final quality) for the command
    line ``a``.  ``--target final`` (the default) reads the map by time to final quality; an error
    reads the crossover study; a ``--study`` file's own metric is the default for it.  Where the
    shipped map has no cell for the user's network and condition yet and no target was given, the
    crossover study's early target, said."""
    if a.study is not None:
        study = load_study(a.study)
        final = is_final(study) if a.target is None else a.target == "final"
        if final and not is_final(study):
            raise ConfigError(f"--study {a.study}: an early-target study (time to {study['target_error']:g} "
                              "error); --target final needs the map's file (metric 'final')")
        if not final and is_final(study):
            raise ConfigError(f"--study {a.study}: the map by time to final quality holds no times to an "
                              "error of your choosing; --target final, or the crossover study's file")
    elif a.target in (None, "final"):
        study, final = load_study(FINAL), True
    else:
        study, final = load_study(STUDY), False
    if not final:
        got = predict(study, prof, a.workers, a.condition, say=say, target=a.target, procs=a.jobs)
        return study, got, False
    res = predict_final(study, prof, a.workers, a.condition, say=say, procs=a.jobs)
    if not isinstance(res, str):
        return study, res, True
    if a.target is not None or a.study is not None:
        raise ConfigError(f"--target final: {res}; the crossover study's early target instead: "
                          "--target 0.4 without --study (or with the crossover study's file)")
    study = load_study(STUDY)
    got = predict(study, prof, a.workers, a.condition, say=say, procs=a.jobs)
    got["notes"].insert(0, f"{res}: the ranking is by time to the crossover study's early target")
    return study, dict(got, metric="target", fallback=res), False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalesgd plan", description=(
        "Rank the training methods for your cluster by predicted time to final quality (or to a "
        "target error), from the project's studies (docs/virtual.md#plan-which-method-for-my-cluster)."))
    ap.add_argument("--profile", required=True, help="your cluster: a shipped profile name or a JSON "
                    "file (docs/virtual.md#profiles)")
    ap.add_argument("--workers", type=int, required=True, help="GPUs (workers) you will train on")
    ap.add_argument("--condition", help="none, typical or stragglers, or a condition's JSON file "
                    "(default: the profile's variability)")
    ap.add_argument("--study", type=Path, help="the study's results (default: the shipped ones: the map "
                    "by time to final quality for --target final, the crossover study for an error)")
    ap.add_argument("--run", action="store_true", help="then check the two fastest in the virtual "
                    "cluster under your profile and condition, at the study's p (one seed each: the map's "
                    "whole schedule, or to the target error within 12 epochs; minutes; run directories "
                    "runs/<time>-plan-<method>-p<p>)")
    ap.add_argument("--data", type=Path, default=Path("data/glyphs/main"), help="--run: the glyph data set "
                    "(default data/glyphs/main: python benchmarks/glyphs.py data/glyphs)")
    ap.add_argument("--target", help="'final' (the default): time to within 1 point of the best synchronous "
                    "final error after a full schedule, from the map by time to final quality; or a top-1 "
                    "error, 0.4 (the crossover study's own) or higher, read from its runs")
    ap.add_argument("--jobs", type=int, help="clock-only runs at a time, each a process of its own "
                    "(default: this machine's cores; 1: one after another in this process)")
    ap.add_argument("--json", action="store_true", help="print the prediction as JSON")
    a = ap.parse_args(argv)
    if a.jobs is not None and a.jobs < 1:
        ap.error(f"--jobs: at least 1, got {a.jobs}")
    logging.basicConfig(level=logging.INFO, format="scalesgd: %(message)s", stream=sys.stderr)
    try:
        prof = P.load(a.profile)
        study, res, final = rank(a, prof, lambda msg: print(f"scalesgd: {msg}", file=sys.stderr, flush=True))
        if not a.json:
            print((show_final if final else show)(res, prof), flush=True)
        try:
            if a.run:
                res["checks"] = (check_final if final else check)(study, res, a.profile, a.data,
                                                                   condition=a.condition)
                for c in res["checks"] if not a.json else ():
                    m = "missed" if c["measured"] is None else f"{c['measured']:.4g} s"
                    print(f"  check: {c['method']}: predicted {c['predicted']:.4g} s, measured {m} "
                          f"(one seed; {c['run_dir']})")
        finally:                        # the prediction, even when a check failed (then without checks)
            if a.json:
                print(json.dumps(res, indent=1))
    except UserError as exc:
        print(f"scalesgd: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0
