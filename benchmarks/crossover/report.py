"""The crossover study's analysis: its records -> the answer.

    python benchmarks/crossover_study.py report          # results/crossover-progress.json,
                                                         # the study file `scalesgd plan` reads and
                                                         # docs/figures/crossover.png (provisional)
    python benchmarks/crossover_study.py report --final  # results/crossover.json (the study complete)

Per (method, p): the tuning table (every configuration's samples and time to target on the tune
split, its score under each network, the choice per network, the runs spent).  Per cell (network,
condition, p): each method's chosen configuration and its time to target per seed (paired seeds:
every method ran the same ones) or, where it did not reach it, the error it reached and why its run
ended (``stopped``: "cap" for an asynchronous run stopped at ``CAP_TIME`` x the best synchronous
time of its cell, to save time, since it could not be the fastest; "horizon" for one that went its
whole horizon and missed; "diverged").  Then:

* **the fastest** of a cell: the lowest mean time among the methods that reached the target in
  every seed; **tied** with it: every such method not clearly slower, i.e. whose paired difference
  to it (its common seeds) has a 95% bootstrap interval that does not lie above 0, or which is
  within 25% of it on fewer than five paired seeds (``claims.paired``; the interval is
  Hesterberg's expanded percentile interval, since the plain one is too narrow for a handful of
  seeds).  A method that missed a seed is not ranked.  Every
  paired interval (here and in the claims) resamples the seeds with the same index draws for the
  same number of seeds (``claims.resamples``), so one difference has one interval
  wherever it is judged, and a new piece of the study leaves the comparisons it does not touch
  exactly as they were.
* **the crossover** per (network, condition): at each p the family first (synchronous: all-reduce,
  local SGD; asynchronous: EASGD, A-SGD, pull gossip, push-sum), by the paired comparison of each
  family's fastest method, or a tie; a family that missed the target at a p loses it to one that
  reached it (*decided by the cap* where a method of it was stopped there: ``decided_by_cap``, per
  cell and in the report's count); every change along p as a bracket [p_i, p_j], and in ``BOOT``
  paired resamples of the seeds (per cell; each family's pick made again in every resample,
  ``claims.picked``) the share of every outcome, "no crossing in range" included.
* **the noise scale**: steps to target of the tuned all-reduce (and one worker) against the global
  batch B = 8p, fitted to S = S_min (1 + B_noise / B) (McCandlish et al. 2018), with a bootstrap
  interval; and B_simple measured directly at the target (``noise_scale.py``), which p is read
  against (B / B_simple) where the fit is not resolved.
"""
from __future__ import annotations

import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np

from . import claims as C
from . import markdown as M
from . import study as X
from .markdown import SHORT, secs

BOOT = 4000
FAMILY = X.FAMILY
PROGRESS = X.ROOT / "results" / "crossover-progress.json"
FINAL = X.ROOT / "results" / "crossover.json"
STUDY_FILE = X.ROOT / "src" / "scalesgd" / "virtual" / "study" / "crossover.json"


def mean(xs):
    return sum(xs) / len(xs) if xs else None


paired_interval = C.paired   # t_a - t_b over the common seeds: interval and call

# ------------------------------------------------------------------------------------------ tuning
def tuning_row(st: X.Study, method: str, p: int) -> dict:
    grid = st.grid(method, p)
    configs = {}
    for c in grid:
        recs = [st.get(r) for r in st.tune_runs(method, p, [c])]
        configs[c] = dict(flags=" ".join(X.flags(method, c, p)),
                          done=sum(r is not None for r in recs),
                          samples_to_target=[r and r["samples_to_target"] for r in recs],
                          final_error=[r and r["final_error"] for r in recs],
                          diverged=[bool(r and r["diverged"]) for r in recs],
                          score={n: st.score(method, p, c, n) for n in X.NETWORKS})
    chosen = {n: st.chosen(method, p, n) for n in X.NETWORKS}
    so_far = {n: st.chosen_so_far(method, p, n) for n, c in chosen.items() if c is None}
    base = len(X.GRIDS[method])
    return dict(method=method, workers=p, configs=configs, chosen=chosen, chosen_so_far=so_far,
                base_points=base, adaptive=len(grid) - base, runs=len(grid) * len(X.TUNE_SEEDS),
                edge=[n for n, c in chosen.items() if c is not None and st.on_edge(c, grid)])


# ------------------------------------------------------------------------------------------- cells
def cell(st: X.Study, p: int, network: str, condition: str) -> dict:
    methods = ("single",) if p == 1 else X.METHODS
    rows, searching = {}, []
    for m in methods:
        c = st.chosen(m, p, network)
        if c is None:                        # (its search goes on: the choice so far, the cell open)
            c = st.chosen_so_far(m, p, network)
            searching.append(m)
        if c is None:
            continue
        per = {}
        for s in (*X.SEEDS, *X.MORE_SEEDS):
            r = st.get(X.Run("sweep", m, p, c, s, network, condition))
            if r is not None:
                t = X.seconds_to(r, network, condition)
                per[s] = dict(seconds=t, samples=r["samples_to_target"], final_error=r["final_error"],
                              epochs=r["epochs"], diverged=r["diverged"],
                              curve=[[v["samples"], v["error"]] for v in r["curve"]],
                              stopped=X.stopped(r, t), end_seconds=X.end_seconds(r, network, condition))
        if not per:
            continue
        times = {s: v["seconds"] for s, v in per.items() if v["seconds"] is not None}
        best_sync = None if X.is_sync(m) else st.cell_sync_best(p, network, condition)
        rows[m] = dict(config=c, flags=" ".join(X.flags(m, c, p)), seeds=per,
                       reached_all=len(times) == len(per) and set(X.SEEDS) <= set(per),
                       mean_seconds=mean(list(times.values())) if len(times) == len(per) else None,
                       final_error=mean([v["final_error"] for v in per.values()]),
                       capped=sum(v["stopped"] == "cap" for v in per.values()),
                       cap_seconds=None if best_sync is None else X.CAP_TIME * best_sync)
    out = dict(workers=p, network=network, condition=condition, methods=rows, fastest=None, tied=[],
               missing=[m for m in methods if len(rows.get(m, {}).get("seeds", {})) < len(X.SEEDS)],
               searching=searching)
    best, tied = rank_rows(rows)
    if best is not None:
        out.update(fastest=best, tied=tied, tied_set=[best, *tied])
    if p > 1:                                # (the families' call here rests on the cap: said)
        out["decided_by_cap"] = bool((family_call(rows) or {}).get("by_cap"))
    return out


def rank_rows(rows: dict) -> tuple[str | None, list[str]]:
    """A cell's fastest method (the least mean seconds of those that reached the target in every
    seed) and the methods not clearly slower than it (the paired rule): the tied.  Sets each
    other's ``vs_fastest`` in ``rows``."""
    ranked = sorted((m for m, r in rows.items() if r["reached_all"]), key=lambda m: rows[m]["mean_seconds"])
    if not ranked:
        return None, []
    best, tied = ranked[0], []
    tb = {s: v["seconds"] for s, v in rows[best]["seeds"].items()}
    for m in ranked[1:]:
        d = paired_interval({s: v["seconds"] for s, v in rows[m]["seeds"].items()}, tb)
        rows[m]["vs_fastest"] = d and {k: v for k, v in d.items() if k != "diffs"}   # (JSON: no array)
        if d is None or d["call"] != "b":       # (not clearly slower: tied)
            tied.append(m)
    return best, tied


def family_call(rows: dict) -> dict | None:
    """At one p: the asynchronous family against the synchronous one, each by its fastest method
    that reached the target in every seed (``claims.compare``: paired seeds, the
    expanded interval, a tie within 25% on too few seeds); a family none of whose methods reached
    it loses to one that did, and None when neither did.  ``family``: "sync", "async" or "tie";
    ``by_cap``: the call was decided by the cap (a method of the losing family had its runs stopped
    at ``CAP_TIME`` x the best synchronous time, ``capped``, rather than missing the target)."""
    c = C.compare(rows, X.ASYNC, C.SYNC_SIDE)
    if c["outcome"] == "neither":
        return None
    return dict(c, family={"claim": "async", "other": "sync", "tie": "tie"}[c["outcome"]])


def sequence_words(seq: list[tuple[int, str]]) -> str:
    """A crossover outcome from the family first at each p, in order (ties left out of ``seq``
    or given as "tie"): every change as "f0 -> f1 in [p0, p1]", p0 the last p where f0 was first
    and p1 the first where f1 is (a tie between them widens the bracket); no change: "no crossing
    in range"."""
    firm = [(p, f) for p, f in seq if f != "tie"]
    span = f"({seq[0][0]}-{seq[-1][0]})" if seq else ""
    if not firm:
        return f"no crossing in range: a tie at every p {span}" if seq else "no evidence"
    words, prev = [], firm[0]
    for p, f in firm[1:]:
        if f != prev[1]:
            words.append(f"{prev[1]} -> {f} in [{prev[0]}, {p}]" if not words
                         else f"-> {f} in [{prev[0]}, {p}]")
        prev = (p, f)
    if words:
        return " ".join(words)
    ties = len(seq) - len(firm)
    return f"no crossing in range: {firm[0][1]}{' or a tie' if ties else ''} at every p {span}"


def crossover(cells: dict[int, dict], rng) -> dict:
    """The family first at each p (``family_call``, ties included) and the changes along p as
    brackets (``sequence_words``); then, in ``BOOT`` resamples, the share of every outcome: at
    each p the common seeds of the two entries (the fastest of each family on all seeds) resampled
    with one index draw for every method (paired), each family's pick made again among its methods
    that ran them, the family with the lower resampled mean first."""
    ps = [p for p in X.WORKERS if p in cells]
    calls = {p: c for p in ps for c in [family_call(cells[p]["methods"])] if c is not None}
    point = sequence_words([(p, c["family"]) for p, c in calls.items()])
    draws = {}                               # p -> BOOT resamples: is the asynchronous entry first?
    for p, c in calls.items():
        if "diffs" not in c:                 # (one family only reached it)
            draws[p] = np.full(BOOT, c["family"] == "async")
            continue
        d = c["diffs"]                       # (async - sync, by common seed)
        idx = rng.integers(0, len(d), size=(BOOT, len(d)))
        # (a pick inside the resample: reflected about the observed difference, as its interval)
        draws[p] = (d[idx].mean(axis=1) if c["pick"] is None
                    else 2 * c["diff"] - C.picked(*c["pick"], idx)) < 0
    counts: dict[str, int] = {}
    for i in range(BOOT):
        o = sequence_words([(p, "async" if draws[p][i] else "sync") for p in calls])
        counts[o] = counts.get(o, 0) + 1
    shares = {k: v / BOOT for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}
    per_p = {p: {k: c.get(k) for k in ("family", "claim", "other", "claim_mean", "other_mean", "diff", "lo",
                                       "hi", "seeds", "few", "by_cap", "capped")} for p, c in calls.items()}
    return dict(outcome=point, shares=shares, per_p=per_p)


# -------------------------------------------------------------------------------------- noise scale
def noise_scale(st: X.Study, rng) -> dict:
    """Fit steps to target = S_min + S_min B_noise / B over B = 8p (the tuned all-reduce, the
    tuning network's choice, and one worker), with a bootstrap over seeds.  ``so_far``: the p
    whose search is still open (their choice so far stands in)."""
    pts, so_far = [], []
    for p in (1, *X.WORKERS):
        m = "single" if p == 1 else "allreduce"
        c = st.chosen(m, p, X.TUNE_NETWORK)
        if c is None:
            c = st.chosen_so_far(m, p, X.TUNE_NETWORK)
            so_far.append(p)
        if c is None:
            continue
        steps = [r["samples_to_target"] / (8 * p) for s in (*X.SEEDS, *X.MORE_SEEDS)
                 for r in [st.get(X.Run("sweep", m, p, c, s, X.TUNE_NETWORK, X.TUNE_CONDITION))]
                 if r is not None and r["samples_to_target"] is not None]
        if steps:
            pts.append((8 * p, steps))
    return dict(fit_noise(pts, rng), so_far=[p for p in so_far if any(b == 8 * p for b, _ in pts)],
                measured=measured_noise())


def measured_noise(path: Path | None = None) -> dict | None:
    """The direct measurement (``noise_scale.py``: B_simple from one worker's batch-8 gradients at
    checkpoints of the study's own one-worker run): per seed its value at the target and interval
    (``seeds``: ``path`` and its siblings ``noise-scale-s<seed>.json`` of the same configuration),
    their mean (``b_simple``), and, from ``path``'s run, its range over the checkpoints within 0.05
    of the target's error (how much it moves from one set of weights to the next, beside the
    interval of the gradients' sampling at each) and along the run.  None if not measured."""
    path = path or X.ROOT / "results" / "noise-scale.json"
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    at = d.get("at_target")
    if not at or at.get("b_simple") is None:
        return None
    seeds = []
    for e in [d, *(json.loads(f.read_text()) for f in sorted(path.parent.glob(f"{path.stem}-s*.json")))]:
        t = e.get("at_target") or {}
        if e.get("config") == d["config"] and t.get("b_simple") is not None:
            seeds.append(dict(seed=e["seed"], b_simple=t["b_simple"], lo=t["lo"], hi=t["hi"],
                              samples=t["samples"], same_as_study_run=e.get("same_as_study_run")))
    seeds.sort(key=lambda e: e["seed"])
    close = [q for q in d["points"] if abs(q["val_error"] - d["target"]) <= 0.05]
    near = [q for q in close if q["b_simple"] is not None]
    every = [q["b_simple"] for q in d["points"] if q["b_simple"] is not None]
    return dict(b_simple=mean([e["b_simple"] for e in seeds]), seeds=seeds, lo=at["lo"], hi=at["hi"],
                samples=at["samples"], config=d["config"], seed=d["seed"],
                gradients=d["points"][0]["gradients"], batch=d["batch"],
                near=dict(low=min(q["b_simple"] for q in near), high=max(q["b_simple"] for q in near),
                          errors=[min(q["val_error"] for q in near), max(q["val_error"] for q in near)],
                          checkpoints=len(near), unresolved=len(close) - len(near)) if near else None,
                along=[min(every), max(every)], unresolved=len(d["points"]) - len(every),
                same_as_study_run=d.get("same_as_study_run"))


def fit_noise(pts: list[tuple[int, list[float]]], rng) -> dict:
    """Fit S = S_min (1 + B_noise / B) to (B, steps to target per seed) by least squares in 1/B,
    weighted by 1/S^2 (relative residuals: a seed's steps vary by a share of them, so unweighted
    squares would let the smallest batches' thousands of steps decide the fit alone), with a
    bootstrap over seeds.  When the fitted S_min is not positive (steps fall as fast as 1/B
    or faster: every batch measured is far below the noise scale), or more than 2.5% of the
    resamples find none (the interval's upper end is then infinite), B_noise is *not resolved*:
    ``b_noise`` is None (``b_noise_fit``: the point fit, if finite) and ``b_noise_lo`` is a lower
    bound (the 2.5th percentile of the resamples, an unresolved resample counting as infinite)."""
    data = [dict(batch=b, steps=mean(s), seeds=len(s)) for b, s in pts]
    if len(pts) < 3:
        return dict(points=len(pts), b_noise=None, resolved=False, data=data)

    def fit(pairs):
        x = np.array([1.0 / b for b, _ in pairs])
        y = np.array([s for _, s in pairs])
        slope, icept = np.polyfit(x, y, 1, w=1 / y)
        return (slope / icept if icept > 0 and slope > 0 else math.inf), icept

    b_noise, s_min = fit([(b, mean(s)) for b, s in pts])
    slope = b_noise * s_min if math.isfinite(b_noise) else None
    # (the point fit's)
    misfit = (max(abs(mean(s) / (s_min + slope / b) - 1) for b, s in pts) if slope else None)
    boots = np.sort([fit([(b, float(np.mean(rng.choice(s, len(s))))) for b, s in pts])[0]
                     for _ in range(BOOT // 4)])

    def pct(q):                              # a percentile of the sorted resamples, inf as None
        v = float(boots[min(len(boots) - 1, int(q / 100 * len(boots)))])
        return v if math.isfinite(v) else None
    unresolved = float(np.mean(~np.isfinite(boots)))
    # resolved: a finite fit whose 95% interval is finite too (over 2.5% of the resamples finding no
    # noise scale leave its upper end at infinity: the point fit alone would say more than the data)
    resolved = math.isfinite(b_noise) and unresolved < 0.025
    return dict(points=len(pts), resolved=resolved, b_noise=float(b_noise) if resolved else None,
                b_noise_fit=float(b_noise) if math.isfinite(b_noise) else None,
                s_min=float(s_min) if resolved else None, b_noise_lo=pct(2.5), b_noise_hi=pct(97.5),
                unresolved_share=unresolved, misfit=misfit, data=data)


# An assumption, stated as one: ImageNet's noise scale in ResNet-50 training is of the order of
# 10^4 (McCandlish et al. 2018 put ImageNet's largest useful batches "in the tens of thousands";
# Goyal et al. 2017 trained at 8,192 without loss of accuracy).
IMAGENET_B_NOISE, IMAGENET_BATCH_PER_GPU = 10_000, 32


def workload(ns: dict) -> dict:
    """p of this task read as GPUs of ResNet-50 on ImageNet at the same global batch over noise
    scale: p_imagenet = p x 8 / B_noise x B_imagenet / 32.  B_noise: the fit's where it is resolved
    (the steps-against-batch trade-off itself, as ImageNet's assumed value is), else the measured
    B_simple at the target (``source`` "measured"), else the fit's lower bound: at most that many
    GPUs (``bound``: "at most")."""
    out = dict(assumed_imagenet_b_noise=IMAGENET_B_NOISE, imagenet_batch_per_gpu=IMAGENET_BATCH_PER_GPU,
               factor=None)
    m = None if ns.get("b_noise") else (ns.get("measured") or {}).get("b_simple")
    b = ns.get("b_noise") or m or ns.get("b_noise_lo")
    if not b:
        return out
    f = 8 / b * IMAGENET_B_NOISE / IMAGENET_BATCH_PER_GPU
    out.update(factor=f, bound="" if m or ns.get("b_noise") else "at most", source="measured" if m else "fit",
               batch_over_b_noise={p: 8 * p / b for p in X.WORKERS},
               imagenet_gpus={p: p * f for p in X.WORKERS})
    return out


# ----------------------------------------------------------------------------------------- assemble
def analyse(st: X.Study | None = None, seed: int = 0) -> dict:
    st = st or X.Study()

    def rng(key: str):
        """The resamples for one crossover or fit: seeded by its name, so that what a new piece of
        the study leaves alone reads the same after it (a cell's paired intervals draw from
        ``claims.resamples``, the same for every comparison of as many seeds)."""
        return np.random.default_rng([seed, zlib.crc32(key.encode())])
    hours: dict[str, float] = {}
    for r in st.recs.values():
        hours[r["kind"]] = hours.get(r["kind"], 0.0) + r.get("real_seconds", 0.0) / 3600
    commits = sorted({r.get("commit") for r in st.recs.values()} - {None})
    out = dict(target_error=X.TARGET, workers=[1, *X.WORKERS], networks=list(X.NETWORKS),
               conditions=list(X.CONDITIONS), tune=dict(network=X.TUNE_NETWORK, condition=X.TUNE_CONDITION,
                                                         seeds=list(X.TUNE_SEEDS), split="tune"),
               seeds=list(X.SEEDS), more_seeds=list(X.MORE_SEEDS), close=X.CLOSE,
               grids={m: [X.cname(*g) for g in g_] for m, g_ in X.GRIDS.items()},
               commits=commits, runs=len(st.recs), machine_hours=hours,
               machine_hours_total=sum(hours.values()))
    timed = [r for r in st.recs.values() if r.get("worker_steps") and r.get("real_seconds")]
    out["ms_per_worker_step"] = (1e3 * sum(r["real_seconds"] for r in timed)
                                 / sum(r["worker_steps"] for r in timed) if timed else None)
    out["tuning"] = {f"{m}/p{p}": tuning_row(st, m, p)
                     for p in (1, *X.WORKERS) for m in (("single",) if p == 1 else X.METHODS)}
    ready, waiting = st.plan()
    pending = st.open_cells               # (every cell a sweep, ready or waiting, is still to come in)
    cells, crossings, fastest = {}, {}, {}
    for n in X.NETWORKS:
        for c in X.CONDITIONS:
            per_p = {}
            for p in (1, *X.WORKERS):
                cl = cell(st, p, n, c)
                cl["complete"] = not cl["missing"] and not cl["searching"] and (p, n, c) not in pending
                if cl["methods"]:
                    cells[f"{n}/{c}/p{p}"] = cl
                    per_p[p] = cl
                    fastest.setdefault(n, {}).setdefault(c, {})[p] = cl.get("tied_set") or []
            crossings[f"{n}/{c}"] = crossover({p: v for p, v in per_p.items() if p > 1 and v["complete"]},
                                             rng(f"{n}/{c}"))
    out.update(cells=cells, map=fastest, crossovers=crossings, noise_scale=noise_scale(st, rng("noise")))
    out["verdicts"] = C.claims(out, st)
    out["decided_by_cap"] = cap_count(out, st)
    out["workload"] = workload(out["noise_scale"])
    out["left"] = dict(ready=len(ready), waiting=len(waiting),
                       ready_hours=sum(r.cost for r in ready) / 3600)
    out["foreign_records"] = len(st.foreign)          # (of another commit than the pinned one: left out)
    return out


def cap_count(res: dict, st: X.Study) -> dict:
    """What the cap decided: the cells whose families' call it decided (``cells``; p > 1), the
    verdicts it decided (``verdicts``: claim / network / condition, with the p), and how the reported
    seeds ended (``seeds``: "target", "cap", "horizon" or "diverged", counted over the cells'
    synchronous rows, a run in every cell it serves; their asynchronous rows; and the authors'
    asynchronous rows, every p and condition); ``least_over_fastest``: the least time a seed stopped
    at the cap had run, over its cell's fastest mean time."""
    seeds: dict[str, dict[str, int]] = {"sync": {}, "async": {}, "authors": {}}
    rows = [("sync" if X.is_sync(m) else "async", r) for cl in res["cells"].values()
            for m, r in cl["methods"].items()]
    rows += [("authors", r) for p in X.WORKERS for c in X.AUTHORS_CONDITIONS
             for m, r in C.authors_rows(st, p, c).items() if not X.is_sync(m)]
    for fam, r in rows:
        for v in r["seeds"].values():
            seeds[fam][v["stopped"]] = seeds[fam].get(v["stopped"], 0) + 1
    cells = [k for k, cl in res["cells"].items() if cl.get("decided_by_cap")]
    verdicts = [dict(claim=v["claim"], network=v["network"], condition=v["condition"], p=v["decided_by_cap"])
                for v in res["verdicts"] if v.get("decided_by_cap")]
    # (the cells where no asynchronous method missed the target at its horizon: every one was capped)
    only = [k for k in cells if all(X.stops(r) == "cap" for m, r in res["cells"][k]["methods"].items()
                                    if m in X.ASYNC)]
    # how far the seeds stopped at the cap had run: their last validation over the cell's fastest
    # mean (the cap is set in whole epochs by a speed measured in the tuning or timing runs)
    ran = [v["end_seconds"] / cl["methods"][cl["fastest"]]["mean_seconds"] for cl in res["cells"].values()
           if cl["fastest"] for r in cl["methods"].values() for v in r["seeds"].values()
           if v["stopped"] == "cap" and v["end_seconds"] is not None]
    return dict(cap_time=X.CAP_TIME, cells=cells, verdicts=verdicts, n_cells=len(cells),
                n_cells_every_method=len(only), n_verdicts=len(verdicts), seeds=seeds,
                least_over_fastest=min(ran, default=None))


def study_file(res: dict) -> dict:
    """What ``scalesgd plan`` reads: per cell each method's settings and per-seed samples and
    time to target (or the error it reached), the tuning choices, and where the study stands."""
    keep = ("config", "flags", "reached_all", "mean_seconds", "final_error")
    cells = {k: dict(fastest=v["fastest"], tied_set=v.get("tied_set", []), complete=v["complete"],
                     missing=v["missing"],
                     methods={m: dict({f: r[f] for f in keep},
                                      seeds={str(s): dict(seconds=x["seconds"], samples=x["samples"],
                                                         final_error=x["final_error"], stopped=x["stopped"],
                                                         **({"curve": x["curve"]} if X.is_sync(m) else {}))
                                             for s, x in r["seeds"].items()})
                              for m, r in v["methods"].items()})
             for k, v in res["cells"].items()}
    return dict(source="benchmarks/crossover/: python benchmarks/crossover_study.py report --final",
                commits=res["commits"], target_error=res["target_error"],
                task=dict(job=(X.ROOT / "jobs" / "glyphs.toml").read_text(), train=51_200, val=5_000,
                          classes=10, eval_every=X.EVAL_EVERY, name="the glyphs (jobs/glyphs.toml)"),
                workers=res["workers"], networks=res["networks"], conditions=res["conditions"],
                complete=res["left"]["ready"] == 0 and res["left"]["waiting"] == 0,
                noise_scale={**{k: res["noise_scale"].get(k)
                                for k in ("b_noise", "b_noise_lo", "b_noise_hi")},
                             "b_simple_measured": (res["noise_scale"].get("measured") or {}).get("b_simple")},
                cells=cells)


COLORS = {"single": "#999999", "allreduce": "#1f77b4", "localsgd": "#6baed6", "easgd": "#d62728",
          "asgd": "#ff9896", "gossip-pull": "#2ca02c", "pushsum-ov": "#98df8a"}


def figure(res: dict, path: Path, provisional: bool = False) -> None:
    """The map as one figure: a panel per network (stacked), conditions by p, each cell the fastest method's
    colour (a hatched cell: others tie with it), its mean time to target written in (marked where the
    families' call was decided by the cap)."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch, Rectangle  # noqa: PLC0415
    ps, conds, nets = res["workers"], res["conditions"], res["networks"]
    fig, axes = plt.subplots(len(nets), 1, figsize=(8.5, 1.0 + 1.9 * len(nets)), squeeze=False)
    for ax, n in zip(axes[:, 0], nets):
        for i, c in enumerate(conds):
            for j, p in enumerate(ps):
                cl = res["cells"].get(f"{n}/{c}/p{p}")
                best = cl and cl["fastest"]
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=COLORS.get(best, "white"), edgecolor="white",
                                       hatch="//" if cl and cl.get("tied") else None))
                label = ("—" if not cl else "miss" if best is None
                         else secs(cl["methods"][best]["mean_seconds"]))
                label += "" if not cl or not cl.get("decided_by_cap") else M.CAP_MARK
                label += "" if not cl or cl["complete"] else "*"
                r, g, b = matplotlib.colors.to_rgb(COLORS.get(best, "white"))
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=8, color=ink)
        ax.set_xlim(0, len(ps))
        ax.set_ylim(0, len(conds))
        ax.set_xticks([j + 0.5 for j in range(len(ps))], [str(p) for p in ps])
        ax.set_yticks([i + 0.5 for i in range(len(conds))], conds)
        ax.set_title(n, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("workers p")
    fig.legend(handles=[Patch(facecolor=v, label=SHORT[k]) for k, v in COLORS.items()], loc="lower center",
               ncol=(len(COLORS) + 1) // 2, fontsize=8, frameon=False)
    capped = any(cl.get("decided_by_cap") for cl in res["cells"].values())
    fig.suptitle(("provisional (*: the cell's runs are not all in): " if provisional else "")
                 + f"fastest to {res['target_error']:.0%} error (hatched: others tie)\n"
                 "simulated seconds of each profile's GPUs and network"
                 + (f"\n{M.CAP_MARK}: decided by the cap (the asynchronous runs stopped at "
                    f"{X.CAP_TIME:g}× the best synchronous time)" if capped else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def main(final: bool = False) -> int:
    """The analysis written: crossover.json when ``final`` (refused while runs are left), else
    crossover-progress.json; the figure and the study file ``plan`` reads either way."""
    res = analyse()
    done = res["left"]["ready"] == 0 and res["left"]["waiting"] == 0
    if final and not done:
        print(f"crossover: {res['left']['ready']} runs ready and {res['left']['waiting']} waiting: "
              "not final", file=sys.stderr)
        return 1
    write(FINAL if final else PROGRESS, res)
    figure(res, X.ROOT / "docs" / "figures" / "crossover.png", provisional=not final)
    if final:
        PROGRESS.unlink(missing_ok=True)          # docs read crossover.json from now on
    write(STUDY_FILE, study_file(res))
    if res["foreign_records"]:
        print(f"crossover: {res['foreign_records']} records of another commit than the pinned one are "
              "left out", file=sys.stderr)
    print(f"{res['runs']} runs, {res['machine_hours_total']:.2f} machine-hours; "
          f"{len(res['cells'])} cells; left: {res['left']}")
    for k, v in res["crossovers"].items():
        if v["outcome"] != "no evidence":
            print(f"  {k}: {v['outcome']}")
    return 0
