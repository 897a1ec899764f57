"""P1 and P3 re-judged: runs to the target with no cap, and A-SGD's rate tuned per n_sync.

``python benchmarks/rejudge.py pin|run|status|report`` (``run --minutes M``: a resumable piece).

The crossover study's two "disagrees" for Paine et al.'s claims came from a cap and an untuned rate:

* **P1** (A-SGD on 8 GPUs is 3.2x faster than one): on ``a100-ib100-resnet50`` and
  ``v100-10gbe-resnet50`` under ``typical``, the 8 clients were stopped at the cap (twice the
  fastest synchronous time of the cell) in 5 and 3 of 5 seeds, and the authors' form (n_sync 1, one
  server, rate 0.2 / p) under the papers' era network without variability in 1 of 5;
* **P3** (a larger n_sync communicates less, coarser but still training): n_sync 10 and 100 ran at
  n_sync 1's rate (0.2 / p) and never reached the target.

Here every run goes to the target or its whole horizon, never to a cap, on the crossover study's task
(the glyphs, ResNet-8 at half width, batch 8 a worker) and its target (40% top-1 error):

* **P1**: one worker (5 seeds on the main split, re-timed exactly under both networks and
  ``typical``, and under the papers' era network and ``none``) against A-SGD at p = 8 under each
  network and ``typical``, ``MAX_EPOCHS`` at most.  A-SGD's search, per n_sync setting (``KNOBS``:
  n_sync 1 with one server, n_sync 4 with four), on the tune split with ``TUNE_SEEDS``: the
  crossover study's chosen rate x 1/2, 1, 2, the edge rule (at most ``EDGE_MORE`` more a setting);
  a configuration's score is its seeds' mean seconds to the target when every seed reaches it (else
  after every one that does, by mean final error).  The best over both settings runs ``SEEDS``.
  The authors' form runs as it is (untuned) with ``SEEDS``.  The call: the speed-up to target
  (one worker's mean over the 8 clients'), its 95% interval over the seeds' bootstrap
  (``claims.resamples``, ``claims.tail``): agrees when the interval reaches 3.2x, disagrees below,
  disagrees when the 8 clients miss the target at their horizon in a seed.
* **P3**: 4 clients on the crossover study's tuning network and condition, ``P3_EPOCHS`` whole
  epochs (no stop: the exchanges and the final error count), n_sync 1, 10 and 100 each with its own
  rate: A-SGD's rule (rate / p) at 0.2, 0.1 and 0.05 and the edge rule (where every rate ended at
  chance, half the lowest: ``Search.grid``), scored by mean samples to
  target (else mean final error) on ``TUNE_SEEDS``; then ``P3_SEEDS`` at each choice.  The call, as
  the crossover study's: comparable when n_sync 100 made >= 50 exchanges a client; agrees when it
  reached the target in every seed, disagrees when in none while n_sync 1 did.

Records under ``results/rejudge/`` (the pinned commit's), the report ``results/rejudge.json``.
"""
from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from crossover import claims, driver, store
from crossover import study as X

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "rejudge"
OUT = ROOT / "results" / "rejudge.json"

P1_NETWORKS = ("a100-ib100-resnet50", "v100-10gbe-resnet50")
P1_CONDITION = "typical"
AUTHORS = ("titanx-fdr-resnet18", "none", "W0.2-a1")          # the authors' form, as it ran
KNOBS = ("a1", "a4")
SINGLE = "F0.04205"             # the crossover study's choice for one worker (every network)
START = 0.003125                # the crossover study's choice for A-SGD at p = 8 (L, both networks)
P3_P, P3_EPOCHS = X.NSYNC_P, X.NSYNC_EPOCHS
P3_RATES = (0.2, 0.1, 0.05)     # A-SGD's own rule, rate / p: n_sync 1's (the authors') and below
P3_NSYNC = (1, 10, 100)
MAX_EPOCHS = X.MAX_EPOCHS
TUNE_SEEDS = X.TUNE_SEEDS
SEEDS = (0, 1, 2, 3, 4)
P3_SEEDS = X.NSYNC_SEEDS
EDGE_MORE = X.EDGE_MORE
CHANCE = 0.9                    # top-1 error of a guess among the glyphs' 10 classes
PAINE = claims.PAINE


def knob(n: int) -> str:
    """P3's n_sync setting (one server)."""
    return f"a{n}"


def key(kind: str, claim: str, p: int, config: str, seed: int, network: str, condition: str) -> str:
    return f"{kind}/{claim}-p{p}-{config}-s{seed}-{network}-{condition}"


def run_of(kind, claim, p, config, seed, network, condition) -> tuple:
    return (kind, claim, p, config, seed, network, condition)


# ----------------------------------------------------------------------------------------- scoring
def score(recs: list[dict], by: str) -> tuple[float, float]:
    """A configuration's score over its tuning seeds' records (lower is better): the mean ``by``
    (seconds or samples) to the target when every seed reaches it, else inf; then the mean final
    error."""
    got = [r[f"{by}_to_target"] for r in recs]
    fe = float(np.mean([r["final_error"] for r in recs]))
    return (float(np.mean(got)) if None not in got else math.inf, fe)


class Search:
    """One rate search: ``grid`` (configurations so far, whether it is over) by the edge rule."""

    def __init__(self, recs: dict, claim: str, p: int, start: list[str], network: str, condition: str,
                 by: str):
        self.recs, self.claim, self.p, self.network, self.condition, self.by = (recs, claim, p, network,
                                                                                condition, by)
        self.start = start

    def runs(self, c: str) -> list[dict] | None:
        got = [self.recs.get(key("tune", self.claim, self.p, c, s, self.network, self.condition))
               for s in TUNE_SEEDS]
        return None if None in got else got

    def grid(self) -> tuple[list[str], bool]:
        """The edge rule per setting: while a setting's best configuration has the highest (lowest)
        rate of that setting's, one more rate twice (half) as large, at most EDGE_MORE a setting.
        Where even the best ended at chance (every rate of the setting learned nothing, so which is
        "best" is noise), half the lowest rate instead: a run that learns nothing in a few epochs
        took too large a step (too small a one still learns, slowly)."""
        cfgs = list(self.start)
        more: dict[str, int] = {}
        while True:
            runs = {c: self.runs(c) for c in cfgs}
            if None in runs.values():
                return cfgs, False
            scores = {c: score(r, self.by) for c, r in runs.items()}
            nxt = []
            for kn in dict.fromkeys(X.parse(c)[2] for c in cfgs):
                mine = [c for c in cfgs if X.parse(c)[2] == kn]
                best = min(mine, key=scores.get)
                rule, rate, _ = X.parse(best)
                same = sorted(X.parse(c)[1] for c in mine)
                step = 2.0 if rate == same[-1] else 0.5 if rate == same[0] else None
                if scores[best][1] >= CHANCE - 0.01:     # nothing learned at any rate: no direction
                    rate, step = same[0], 0.5            # in their noise; a smaller step, the cure
                if step is not None and more.get(kn, 0) < EDGE_MORE:
                    more[kn] = more.get(kn, 0) + 1
                    nxt.append(X.cname(rule, float(f"{rate * step:.4g}"), kn))
            if not nxt:
                return cfgs, True
            cfgs += nxt

    def chosen(self) -> str | None:
        cfgs, over = self.grid()
        if not over:
            return None
        return min(cfgs, key=lambda c: score(self.runs(c), self.by))


def searches(recs: dict) -> dict[str, Search]:
    out = {}
    for n in P1_NETWORKS:
        start = [X.cname("L", float(f"{START * f:.4g}"), k) for k in KNOBS for f in (0.5, 1.0, 2.0)]
        out[f"P1/{n}"] = Search(recs, "p1", 8, start, n, P1_CONDITION, "seconds")
    for ns in P3_NSYNC:
        out[f"P3/n{ns}"] = Search(recs, f"p3n{ns}", P3_P, [X.cname("W", r, knob(ns)) for r in P3_RATES],
                                  X.TUNE_NETWORK, X.TUNE_CONDITION, "samples")
    return out


def todo(recs: dict) -> list[tuple]:
    """The runs ready now, as (kind, claim, p, config, seed, network, condition)."""
    out = [run_of("rep", "single", 1, SINGLE, s, AUTHORS[0], AUTHORS[1]) for s in SEEDS]
    out += [run_of("rep", "authors", 8, AUTHORS[2], s, AUTHORS[0], AUTHORS[1]) for s in SEEDS]
    for name, se in searches(recs).items():
        cfgs, over = se.grid()
        out += [run_of("tune", se.claim, se.p, c, s, se.network, se.condition)
                for c in cfgs for s in TUNE_SEEDS]
        c = se.chosen()
        if c is not None:
            out += [run_of("rep", se.claim, se.p, c, s, se.network, se.condition)
                    for s in (SEEDS if name.startswith("P1") else P3_SEEDS)]
    return [r for r in out if key(*r) not in recs]


# ----------------------------------------------------------------------------------------- the calls
def single_seconds(recs: dict, network: str, condition: str) -> list[float] | None:
    """One worker's seconds to target per seed under (network, condition): its re-timed curve."""
    out = []
    for s in SEEDS:
        r = recs.get(key("rep", "single", 1, SINGLE, s, AUTHORS[0], AUTHORS[1]))
        if r is None:
            return None
        if "retimed" not in r:                 # diverged: no time to the target
            out.append(None)
            continue
        t = r["retimed"][f"{network}/{condition}"]
        curve = [dict(c, seconds=x) for c, x in zip(r["curve"], t)]
        out.append(X.interpolate(curve, "seconds"))
    return out


def p1(recs: dict, network: str, condition: str, claim: str, config: str | None, label: str) -> dict:
    row = dict(claim=label, network=network, condition=condition, config=config)
    one = single_seconds(recs, network, condition)
    many = None if config is None else [recs.get(key("rep", claim, 8, config, s, network, condition))
                                        for s in SEEDS]
    if one is None or many is None or None in many:
        return dict(row, verdict="not run yet")
    if None in one:
        return dict(row, verdict="not run", evidence="one worker missed the target in a seed")
    b = [r["seconds_to_target"] for r in many]
    if None in b:
        gone = [r for r in many if r["seconds_to_target"] is None and r.get("diverged")]
        missed = [r for r in many if r["seconds_to_target"] is None and not r.get("diverged")]
        said = []
        if missed:
            said.append(f"missed the target at their horizon ({MAX_EPOCHS} epochs) in {len(missed)} of "
                        f"{len(b)} seeds (ending at {np.mean([r['final_error'] for r in missed]):.0%} error)")
        if gone:
            said.append(f"diverged in {len(gone)} of {len(b)} seeds")
        return dict(row, verdict="disagrees", missed=len(missed), diverged=len(gone),
                    evidence="8 clients " + " and ".join(said))
    a, b = np.array(one), np.array(b)
    boots = a[claims.resamples(len(a), 1)].mean(1) / b[claims.resamples(len(b), 2)].mean(1)
    q = 100 * claims.tail(min(len(a), len(b)))
    lo, hi = float(np.percentile(boots, q)), float(np.percentile(boots, 100 - q))
    sp = float(a.mean() / b.mean())
    return dict(row, verdict="agrees" if hi >= PAINE else "disagrees", speedup=sp, lo=lo, hi=hi,
                one_seconds=float(a.mean()), many_seconds=float(b.mean()),
                evidence=f"speed-up to target {sp:.2f}x [{lo:.2f}–{hi:.2f}]: {a.mean():.0f} s with one "
                         f"worker, {b.mean():.0f} s with 8 clients ({config})")


def p3(recs: dict, se: dict[str, Search]) -> dict:
    per = {}
    for ns in P3_NSYNC:
        s = se[f"P3/n{ns}"]
        c = s.chosen()
        got = None if c is None else [recs.get(key("rep", s.claim, P3_P, c, sd, s.network, s.condition))
                                      for sd in P3_SEEDS]
        if got is None or None in got:
            return dict(claim="P3", verdict="not run yet")
        steps = [r["worker_steps"] for r in got if r.get("worker_steps") is not None]   # (diverged: none)
        per[ns] = dict(config=c, reached=sum(r["samples_to_target"] is not None for r in got),
                       exchanges=float(np.mean(steps)) / P3_P / ns if steps else 0.0,
                       diverged=sum(bool(r.get("diverged")) for r in got),
                       final_error=float(np.mean([r["final_error"] for r in got])))
    if per[100]["exchanges"] < 50:
        v = "not comparable"
    elif per[100]["reached"] == len(P3_SEEDS):
        v = "agrees"
    elif per[100]["reached"] == 0 and per[1]["reached"] > 0:
        v = "disagrees"
    else:
        v = "partly agrees"
    ev = "; ".join(f"n_sync {n} ({d['config']}): reached in {d['reached']} of {len(P3_SEEDS)} seeds"
                   + (f" ({d['diverged']} diverged)" if d["diverged"] else "")
                   + f", {d['exchanges']:.0f} exchanges per client, final error {d['final_error']:.0%}"
                   for n, d in per.items())
    return dict(claim="P3", network=X.TUNE_NETWORK, condition=X.TUNE_CONDITION, verdict=v, evidence=ev,
                per={str(n): d for n, d in per.items()})


# ----------------------------------------------------------------------------------------- running
def pinned() -> str | None:
    return store.pinned(RESULTS)


def records() -> dict[str, dict]:
    pin = pinned()
    return {k: r for k, r in store.records(RESULTS).items() if r.get("commit") == pin}


def run_cost(run: tuple) -> float:
    kind, claim, p, *_ = run
    epochs = P3_EPOCHS if claim.startswith("p3") else 3 if claim == "single" else MAX_EPOCHS
    return X.STEP_COST_S * 51_200 / 8 * epochs


def execute(run: tuple, sha: str, wt: Path, dirs: dict, scratch: Path) -> dict:
    kind, claim, p, config, seed, network, condition = run
    rk = key(*run)
    run_dir = scratch / rk
    method = "single" if claim == "single" else "asgd"
    p3 = claim.startswith("p3")
    args = ["--data", str(dirs["tune" if kind == "tune" else "sweep"]), *X.flags(method, config, p),
            "--seed", str(seed), "--workers", str(p), "--epochs", str(P3_EPOCHS if p3 else MAX_EPOCHS),
            "--eval-every", str(X.EVAL_EVERY), "--profile", network, "--condition", condition]
    if not p3:
        args += ["--stop-at-error", str(X.TARGET)]
    got = driver.glyph_run(wt, rk, run_dir, args)
    rec = driver.summarize(X.Run(kind, method, p, config, seed, network, condition,
                                 P3_EPOCHS if p3 else MAX_EPOCHS), run_dir, got["argv"], got["diverged"],
                           got["why"])
    rec.update(key=rk, claim=claim)
    if claim == "single" and not got["diverged"]:          # the pairs P1 reads, no more
        rec["retimed"] = {**driver.retime(run_dir, wt, got["env"], P1_NETWORKS, (P1_CONDITION,)),
                          **driver.retime(run_dir, wt, got["env"], AUTHORS[:1], AUTHORS[1:2])}
    rec.update(commit=sha, real_seconds=time.perf_counter() - got["t0"])
    store.write(RESULTS, rk, rec)
    shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def piece(minutes: float, jobs: int, data: Path, scratch: Path) -> int:
    sha = pinned() or sys.exit("rejudge: no pinned commit yet: python benchmarks/rejudge.py pin")
    wt = driver.tree(sha)
    dirs = driver.data_dirs(data)
    driver.run_pool(jobs, minutes, lambda: todo(records()), lambda r: execute(r, sha, wt, dirs, scratch),
                    run_cost, lambda r: key(*r),
                    lambda r, rec: f"{rec['key']}: final error {rec['final_error']:.4f}, "
                                   f"{rec['real_seconds']:.0f} s real")
    return status()


def summary(recs: dict | None = None) -> dict:
    recs = records() if recs is None else recs
    se = searches(recs)
    rows = [p1(recs, n, P1_CONDITION, "p1", se[f"P1/{n}"].chosen(), "P1") for n in P1_NETWORKS]
    rows.append(p1(recs, AUTHORS[0], AUTHORS[1], "authors", AUTHORS[2], "P1 (the authors' form)"))
    rows.append(p3(recs, se))
    tuning = {}
    for name, s in se.items():
        cfgs, over = s.grid()
        tuning[name] = dict(over=over, chosen=s.chosen(),
                            configs={c: None if s.runs(c) is None else
                                     [None if x == math.inf else x for x in score(s.runs(c), s.by)]
                                     for c in cfgs})
    left = todo(recs)
    return dict(experiment="rejudge", commit=pinned(), target_error=X.TARGET, max_epochs=MAX_EPOCHS,
                p3_epochs=P3_EPOCHS, runs=len(recs),
                machine_hours=sum(r.get("real_seconds", 0.0) for r in recs.values()) / 3600,
                ready=len(left), complete=not left and all(r["verdict"] != "not run yet" for r in rows),
                rows=rows, tuning=tuning)


def status() -> int:
    d = summary()
    print(f"rejudge: {d['runs']} runs, {d['machine_hours']:.2f} machine-hours; ready now {d['ready']} runs")
    for name, t in d["tuning"].items():
        print(f"  {name}: {len(t['configs'])} configurations, "
              + (f"over, chosen {t['chosen']}" if t["over"] else "open"))
    for r in d["rows"]:
        print(f"  {r['claim']} {r.get('network', '')} {r.get('condition', '')}: {r['verdict']}"
              + (f" ({r['evidence']})" if r.get("evidence") else ""))
    return 0


def main(argv=None) -> int:
    return driver.study_main(argv, __doc__, "rejudge", RESULTS, pinned, piece, summary, OUT, status,
                             "rejudge")


if __name__ == "__main__":
    sys.exit(main())
