"""The map by time to final quality: which family, synchronous or asynchronous, reaches within δ
of the best synchronous final error first, by p, network and condition, after a full schedule of
``E`` epochs (``final_study.py`` chose E and its pilot the search; this module is the study).

``python benchmarks/final_map.py pin|run|status|report`` (``run --minutes M``: a resumable piece).

**Task and runs.** The crossover study's (the glyphs, ResNet-8 at half width, batch 8 a worker),
each run a virtual-cluster run of the pinned commit (``results/final-map/pin.json``) over a cosine
schedule of ``E`` epochs after a 0.5-epoch warm-up, the peak rate by linear scaling
(``--linear-scaling --reference-batch 8``: the rates below are per 8 images).  One rule for every
method: under a common warm-up and schedule a fixed rate is a linear-scaled one at another value, so
the crossover study's two rules are one search here.  Each finished run is a record under
``results/final-map/`` (commit them as you go); a piece stopped anywhere resumes where they end.

**The budget E = 8** (``final_study``'s guard): the pilot's verdict (all-reduce first to the
quality, push-sum missing it) is the same at 8, 16 and 32 epochs, and the study at 16 would not fit
the 60 machine-hours.  Push-sum's deficit there shrinks with the budget (16.8, 7.1, 4.5 points):
the map decides which family is first; its gaps overstate those of longer schedules.

**Cells.** p in ``P`` on the three networks of one GPU a node (``FLAT``), and p in ``NODE_P`` on the
two of eight GPUs a node (``NODE``), run as node agents (``--hierarchy node``: a node's GPUs reduce
inside the node, the node is the agent; at p = 8 those networks are one node, with no exchange
between agents), under the conditions ``CONDITIONS``.  The methods (the families' entries in the
crossover study at p >= 8): all-reduce and local SGD (synchronous: their arithmetic ignores the
clock, so each run is re-timed exactly under every network of its kind and every condition) and
overlapped push-sum (SGP's form; asynchronous: it runs under each network, and under ``none`` and
``stragglers`` only, ``typical`` having made the same family call as ``none`` at 18 of 21 p of the
early-target study).  EASGD and A-SGD are left out (budget: 60 machine-hours).

**The same search for every method** (``Search``), on the tune split with ``TUNE_SEEDS``:
1. the grid: the starting configuration's rate x 1/2, 1, 2 with its setting.  It is the
   neighbouring p's choice (the searches run from p = 32 down); at p = 32 the pilot's rates
   (all-reduce, push-sum) and, for local SGD, twice its early-target rate (the factor by which both
   pilot methods' final-quality rates exceeded theirs) with tau 4 (``SETTINGS``);
2. the edge rule within the choice's setting: while the choice's rate is the highest (lowest) of
   its setting's, one more rate twice (half) as large, at most ``EDGE_MORE`` a setting;
3. the settings step (a method with more than one setting): the choice's rate with each other
   setting; a setting that then wins gets its own grid and edge rule.
A synchronous line is searched first by its mean final error: the least over both methods at a p is
the tuning quality F*.  Its choice under each network (condition ``TUNE_CONDITION``) is then its
configuration whose seeds' mean curve is first to F* + ``DELTA`` there, else its least final
error, and the edge rule applies to those choices too.  Push-sum is searched by that time to quality
from the start (its search waits for F* at its p).  All-reduce as node agents sums the same
gradients in another order: it takes its choice from the one-GPU-a-node search, timed under the
network of the same hardware against the node agents' F*.

**Push-sum's twins.** Push-sum's numbers follow its event order (which messages each drain
folds, the sample counter's order), and nothing else the clock decides: a replay redoes a run from
that order alone (``io/trace.py``).  Before a push-sum run, a clock-only run of it
(``crossover/clock_trace.py``, about 25 s at p = 32) gives its order's digest and its clock; a
record of the same configuration, seed and split on another network or condition with that
order (its *twin*) gives the run's errors, at the clock-only run's times (``retimed_from``).  Under
``none`` titanx-fdr and a100-ib100 have one order (every push lands before its target's next drain;
on 10 GbE a drain later).  Every real push-sum run records its trace's digest and whether its
clock-only run had the same order and the same times (``clock_same``): a twin must have both.

**Reported runs** (``SEEDS``, the main split): every choice, each seed, paired across methods.
Per cell: F* = the least synchronous mean final error; per method its mean final error, the time
its seeds' mean curve takes to F* + ``DELTA`` (δ = 1 point: about the spread of two seeds' final
errors at one configuration, ``final_study``'s pilot), to the early target (40%), and to its end.
**The family call** (``call``): the difference of the two families' times to quality, each family's
pick (its faster method) and F* redone in each of the seeds' bootstrap resamples (the same seeds for
every method), a family whose mean curve misses the quality in a resample last there; its 95%
interval below 0: synchronous first; above 0: asynchronous first; else a tie.  A push-sum that misses
the quality is still reported: its whole schedule's time against the time the synchronous pick
takes to push-sum's own final error, and how much worse it ends.  No run is stopped early.  A
cell waits for every method it holds; a diverged seed is carried at chance (error 0.9) after it
stopped.  Planning: ``final_study.epoch_cost`` (the synchronous runs' re-timings, 9 or 6 replays
without arithmetic, are not counted); a likely twin (a record of it on a network that has shared
its event order, ``order_peers``) at a clock-only run's cost.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import final_study as F
from crossover import claims, clock_trace, driver, store

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "final-map"
OUT = ROOT / "results" / "final-map.json"
PLAN_FILE = ROOT / "src" / "scalesgd" / "virtual" / "study" / "final.json"      # what ``plan`` reads

E = 8
DELTA = F.DELTA
TARGET = F.TARGET
WARMUP = F.WARMUP
P = (32, 16, 8)                          # the searches' order: each p starts from the one before
NODE_P = (32, 16)
FLAT = ("titanx-fdr-resnet18", "a100-ib100-resnet50", "v100-10gbe-resnet50")
NODE = ("v100x8-10gbe-resnet50", "a100x8-ib100-resnet50")
NODE_OF = {"v100x8-10gbe-resnet50": "v100-10gbe-resnet50", "a100x8-ib100-resnet50": "a100-ib100-resnet50"}
CONDITIONS = ("none", "typical", "stragglers")
ASYNC_CONDITIONS = ("none", "stragglers")
TUNE_CONDITION = "none"
TUNE_SEEDS = (100, 101)
SEEDS = (0, 1, 2, 3, 4)
EDGE_MORE = 2
SYNC, ASYNC = ("allreduce", "localsgd"), ("pushsum-ov",)
FLAGS = {"allreduce": ["--method", "allreduce"], "localsgd": ["--method", "localsgd"],
         "pushsum-ov": ["--method", "gossip", "--gossip", "push", "--gossip-overlap", "--gossip-graph",
                        "exponential"]}
SETTINGS = {"allreduce": ("",), "pushsum-ov": ("",), "localsgd": ("t4", "t16m")}
SETTING_FLAGS = {"": [], "t4": ["--tau", "4"], "t16m": ["--tau", "16", "--slowmo-beta", "0.6"]}
# p = 32's starting rates: the pilot's choices (final_study, E = 16); local SGD twice its early-target one
START = {"allreduce": 0.07072, "pushsum-ov": 0.08408, "localsgd": 0.01768}
B_NOISE = 700.0            # the glyph task's noise scale at the early target (crossover.json), images


def agents(network: str) -> str:
    return "node" if network in NODE else "flat"


def networks_of(kind: str) -> tuple[str, ...]:
    return NODE if kind == "node" else FLAT


def ps_of(kind: str) -> tuple[int, ...]:
    return NODE_P if kind == "node" else P


def config(rate: float, setting: str) -> str:
    return f"L{rate:.4g}" + (f"-{setting}" if setting else "")


def parse(cfg: str) -> tuple[float, str]:
    """(rate, setting) of a configuration's name (a rate may print with an exponent: L3.4e-05)."""
    head, _, setting = cfg.rpartition("-")
    if setting not in SETTING_FLAGS or not head:
        head, setting = cfg, ""
    return float(head[1:]), setting


def run_key(kind: str, method: str, ag: str, p: int, cfg: str, seed: int, network: str | None = None,
            condition: str | None = None) -> str:
    """A record's key: tune|rep / method-agents-p-E-config-seed, and the network and condition of a
    run whose arithmetic depends on the clock (push-sum)."""
    where = "" if network is None else f"-{network}-{condition}"
    return f"{kind}/{method}-{ag}-p{p}-E{E}-{cfg}-s{seed}{where}"


def flags(method: str, cfg: str, ag: str) -> list[str]:
    rate, setting = parse(cfg)
    return [*FLAGS[method], "--lr", f"{rate:g}", "--linear-scaling", "--reference-batch", "8",
            *SETTING_FLAGS[setting], *(["--hierarchy", "node"] if ag == "node" else [])]


# ----------------------------------------------------------------------------------- reading runs
def curve_of(rec: dict, network: str, condition: str) -> list[dict] | None:
    """A record's validation curve (seconds, error) under (network, condition): a re-timing of a
    synchronous run, a push-sum run's own (None: not run there).  A diverged synchronous run that
    could not be re-timed: an empty curve (``padded`` carries it at chance)."""
    if rec["method"] in SYNC:
        times = rec.get("retimed", {}).get(f"{network}/{condition}")
        if times is None:
            return [] if rec.get("diverged") else None
        return [dict(c, seconds=t) for c, t in zip(rec["curve"], times)]
    if (rec["network"], rec["condition"]) != (network, condition):
        return None
    return rec["curve"]


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """The curves averaged validation by validation (``final_study.mean_curve``)."""
    return F.mean_curve([dict(curve=c) for c in curves])


class Search:
    """The tuning of one line: (method, agents, p, network for push-sum, else None)."""

    def __init__(self, plan: "Plan", method: str, ag: str, p: int, network: str | None):
        self.plan, self.method, self.ag, self.p, self.network = plan, method, ag, p, network

    def key(self, cfg: str, seed: int) -> str:
        return run_key("tune", self.method, self.ag, self.p, cfg, seed, self.network,
                       None if self.network is None else TUNE_CONDITION)

    def runs(self, cfg: str) -> list[dict] | None:
        got = [self.plan.recs.get(self.key(cfg, s)) for s in TUNE_SEEDS]
        return None if None in got else got

    def start(self) -> tuple[float, str] | None:
        """(rate, setting) the grid starts from: the neighbouring p's choice (None while it is not
        known), at the first p the pilot's rate (node agents: the one-GPU-a-node line's choice)."""
        ps = ps_of(self.ag)
        if self.p != ps[0]:
            before = Search(self.plan, self.method, self.ag, ps[ps.index(self.p) - 1], self.network)
        elif self.ag == "node":
            before = Search(self.plan, self.method, "flat", self.p,
                            None if self.network is None else NODE_OF[self.network])
        else:
            return START[self.method], SETTINGS[self.method][0]
        c = before.chosen()
        return None if c is None else parse(c)

    def judgements(self) -> list[tuple[str, str]]:
        """The (network, agents whose F*) under which this line's configurations are chosen: a
        push-sum line its own; a synchronous line every network of its kind, and one-GPU-a-node
        all-reduce at a node p also the node networks' (node agents' all-reduce takes its choice
        from this search, timed under the one-GPU-a-node network of the same hardware)."""
        if self.network is not None:
            return [(self.network, self.ag)]
        out = [(n, self.ag) for n in networks_of(self.ag)]
        if self.method == "allreduce" and self.ag == "flat" and self.p in NODE_P:
            out += [(NODE_OF[n], "node") for n in NODE]
        return out

    def score(self, cfg: str, network: str | None = None, qag: str | None = None) -> tuple | None:
        """A synchronous line's own score: (mean final error,); push-sum's, or any line's under
        ``network`` (F* of ``qag``'s agents): (0, seconds of the mean curve to F* + DELTA) or (1,
        mean final error).  None while a run (or F*) is missing."""
        got = self.runs(cfg)
        if got is None:
            return None
        fe = float(np.mean([g["final_error"] for g in got]))
        if self.method in SYNC and network is None:
            return (fe,)
        if any(g["diverged"] for g in got):         # (a diverged seed's curve ends early)
            return (1, fe)
        f = self.plan.fstar_tune(qag or self.ag, self.p)
        if f is None:
            return None
        curves = [curve_of(g, network or self.network, TUNE_CONDITION) for g in got]
        t = None if None in curves else F.interpolate(mean_curve(curves), f + DELTA)
        return (0, t) if t is not None else (1, fe)

    @staticmethod
    def edge(cfg: str, cfgs: list[str], more: dict) -> list[str]:
        """The edge rule within ``cfg``'s setting: a rate past the edge it sits on (at most
        EDGE_MORE a setting; ``more`` counts them); a setting tried at one rate gets its grid."""
        r, st = parse(cfg)
        rates = [parse(c)[0] for c in cfgs if parse(c)[1] == st]
        if len(rates) == 1:
            return [config(float(f"{r * f:.4g}"), st) for f in (0.5, 2.0)]
        for hit, f in ((r == max(rates), 2.0), (r == min(rates), 0.5)):
            if hit and more[st] < EDGE_MORE:
                more[st] += 1
                return [config(float(f"{r * f:.4g}"), st)]
        return []

    def first(self) -> tuple[list[str], bool, dict]:
        """The search by the line's own score (a synchronous line's by final error: its least is
        F*'s candidate): the grid, the edge rule, the settings step.  (configurations, over, the
        edge steps taken per setting); kept by the plan."""
        k = (self.method, self.ag, self.p, self.network)
        if k not in self.plan.firsts:
            self.plan.firsts[k] = self._first()
        return self.plan.firsts[k]

    def _first(self) -> tuple[list[str], bool, dict]:
        more = {st: 0 for st in SETTINGS[self.method]}
        if self.method == "allreduce" and self.ag == "node":
            return [], True, more
        s = self.start()
        if s is None:
            return [], False, more
        rate, first = s
        cfgs = [config(float(f"{rate * f:.4g}"), first) for f in (0.5, 1.0, 2.0)]
        settings_done = len(SETTINGS[self.method]) == 1
        while True:
            scores = {c: self.score(c) for c in cfgs}
            if None in scores.values():
                return cfgs, False, more
            best = min(cfgs, key=scores.get)
            nxt = self.edge(best, cfgs, more)
            if not nxt and not settings_done:
                r, st = parse(best)
                nxt, settings_done = [config(r, o) for o in SETTINGS[self.method] if o != st], True
            nxt = [c for c in nxt if c not in cfgs]
            if not nxt:
                return cfgs, True, more
            cfgs += nxt

    def grid(self) -> tuple[list[str], bool]:
        """(the configurations so far, whether the search is over): ``first``, then, for a
        synchronous line, the edge rule on its choice by time to quality under each judgement
        (``judgements``), as push-sum's search applies it to its own.  Kept by the plan."""
        k = (self.method, self.ag, self.p, self.network)
        if k not in self.plan.grids:
            self.plan.grids[k] = self._grid()
        return self.plan.grids[k]

    def _grid(self) -> tuple[list[str], bool]:
        cfgs, over, more = self.first()
        cfgs, more = list(cfgs), dict(more)
        if not over or self.method not in SYNC or not cfgs:
            return cfgs, over
        while True:
            nxt = []
            for net, qag in self.judgements():
                scores = {c: self.score(c, net, qag) for c in cfgs}
                if None in scores.values():
                    return cfgs, False
                nxt += [c for c in self.edge(min(cfgs, key=scores.get), cfgs, more) if c not in nxt]
            nxt = [c for c in nxt if c not in cfgs]
            if not nxt:
                return cfgs, True
            cfgs += nxt

    def best_error(self) -> float | None:
        """The least mean final error of ``first`` once it is over (F*'s candidate)."""
        cfgs, over, _ = self.first()
        if not over or not cfgs:
            return None
        return min(float(np.mean([g["final_error"] for g in self.runs(c)])) for c in cfgs)

    def chosen(self, network: str | None = None) -> str | None:
        """The configuration chosen: by the line's own score, or under ``network`` (a synchronous
        line's choice by time to quality there); None before the search (and F*) is over.  Kept by
        the plan."""
        k = (self.method, self.ag, self.p, self.network, network)
        if k not in self.plan.choice:
            self.plan.choice[k] = self._chosen(network)
        return self.plan.choice[k]

    def _chosen(self, network: str | None) -> str | None:
        if self.method == "allreduce" and self.ag == "node":
            flat = Search(self.plan, "allreduce", "flat", self.p, None)
            return flat.choose(NODE_OF[network or NODE[0]], "node")
        return self.choose(network, self.ag)

    def choose(self, network: str | None, qag: str) -> str | None:
        cfgs, over = self.grid()
        if not over:
            return None
        if self.method in SYNC and network is None:
            return min(cfgs, key=self.score)
        scores = {c: self.score(c, network, qag) for c in cfgs}
        return None if None in scores.values() else min(cfgs, key=scores.get)


class Plan:
    """The records and what can run next."""

    def __init__(self, recs: dict | None = None):
        self.recs = records() if recs is None else recs
        self.grids: dict[tuple, tuple[list[str], bool]] = {}
        self.firsts: dict[tuple, tuple[list[str], bool, dict]] = {}
        self.choice: dict[tuple, str | None] = {}

    def fstar_tune(self, ag: str, p: int) -> float | None:
        """F* of the tuning: the least mean final error of the synchronous searches at p (node
        agents: local SGD's own, all-reduce's from one GPU a node); None while one is open."""
        got = [Search(self, m, "flat" if m == "allreduce" else ag, p, None).best_error() for m in SYNC]
        return None if None in got else min(got)

    def lines(self) -> list[Search]:
        out = []
        for ag in ("flat", "node"):
            for p in ps_of(ag):
                out += [Search(self, m, ag, p, None) for m in SYNC]
                out += [Search(self, m, ag, p, n) for m in ASYNC for n in networks_of(ag)]
        return out

    def choices(self, s: Search) -> set[str]:
        """The configurations ``s`` reports (a synchronous line: its choice under each network of
        its kind); empty while not known."""
        nets = [s.network] if s.network else list(networks_of(s.ag))
        got = {s.chosen(n) for n in nets}
        return set() if None in got else got

    def todo(self) -> list[tuple]:
        """The runs ready now, the largest p first (its cells complete first); at a p the
        synchronous lines' tuning (it decides F* and opens the next p), then their reported runs
        (the cells of a condition without push-sum are complete with them), then push-sum's
        reported runs where its search is over, a cell's seeds one after another (each completes a
        cell), then its tuning elsewhere; as (kind, method, agents, p, config, seed, network or
        None, condition or None)."""
        tune, rep = [], []
        for s in self.lines():
            cfgs, _ = s.grid()
            tune += [("tune", s.method, s.ag, s.p, c, seed, s.network, s.network and TUNE_CONDITION)
                     for c in cfgs for seed in TUNE_SEEDS if s.key(c, seed) not in self.recs]
            conds = ASYNC_CONDITIONS if s.network else (None,)
            rep += [("rep", s.method, s.ag, s.p, c, seed, s.network, cond)
                    for c in sorted(self.choices(s)) for cond in conds for seed in SEEDS
                    if run_key("rep", s.method, s.ag, s.p, c, seed, s.network, cond) not in self.recs]
        return sorted(tune + rep, key=lambda r: (-r[3], r[1] in ASYNC, (r[0] == "rep") != (r[1] in ASYNC)))


# ------------------------------------------------------------------------------------ the cells
def expected(condition: str) -> tuple[str, ...]:
    """The methods a cell holds under ``condition`` (push-sum runs under ASYNC_CONDITIONS only)."""
    return (*SYNC, *(ASYNC if condition in ASYNC_CONDITIONS else ()))


def reported(recs: dict, plan: Plan, ag: str, p: int, network: str, condition: str) -> dict | None:
    """method -> (its reported configuration, {seed: curve} under (network, condition)) for every
    method the cell holds; None while one of them lacks a choice or a seed."""
    out = {}
    for m in expected(condition):
        s = Search(plan, m, ag, p, network if m in ASYNC else None)
        c = s.chosen(network)
        if c is None:
            return None
        keys = {seed: run_key("rep", m, ag, p, c, seed, network if m in ASYNC else None,
                              condition if m in ASYNC else None) for seed in SEEDS}
        if any(k not in recs for k in keys.values()):
            return None
        curves = {seed: curve_of(recs[k], network, condition) for seed, k in keys.items()}
        if None in curves.values():
            return None
        out[m] = (c, curves)
    return out


def finite(x: float) -> float | str:
    """``x``, or "inf" / "-inf" (JSON has no infinities)."""
    return float(x) if np.isfinite(x) else ("inf" if x > 0 else "-inf")


def padded(curves: list[list[dict]], x: str = "seconds") -> np.ndarray | None:
    """Seeds x validations x (``x``: seconds or samples, error); a diverged seed's curve, which ends
    early, carried on at error 0.9 (chance) at the other seeds' mean ``x``.  None: every seed
    diverged at once."""
    n = max(len(c) for c in curves)
    if n == 0:
        return None
    full = [c for c in curves if len(c) == n]
    out = []
    for c in curves:
        rows = [(v[x], v["error"]) for v in c]
        rows += [(float(np.mean([f[i][x] for f in full])), 0.9) for i in range(len(c), n)]
        out.append(rows)
    return np.array(out, dtype=float)


def first_times(mean: np.ndarray, quality) -> np.ndarray:
    """Per row of ``mean`` (... x validations x (seconds, error)): the seconds its error first
    reaches ``quality`` (a scalar or one per row), linear between the validation before and the
    first at or below it, as ``final_study.interpolate``; inf where it never does."""
    sec, err = mean[..., 0], mean[..., 1]
    q = np.broadcast_to(np.asarray(quality, dtype=float)[..., None], err.shape)
    hit = err <= q
    j = hit.argmax(axis=-1)[..., None]
    t = np.take_along_axis(sec, j, -1)[..., 0]
    jp = np.maximum(j - 1, 0)
    e0, e1 = np.take_along_axis(err, jp, -1)[..., 0], np.take_along_axis(err, j, -1)[..., 0]
    s0 = np.take_along_axis(sec, jp, -1)[..., 0]
    inner = (j[..., 0] > 0) & (e0 > e1)
    f = np.where(inner, (e0 - q[..., 0]) / np.where(inner, e0 - e1, 1.0), 0.0)
    t = np.where(inner, s0 + f * (t - s0), t)
    return np.where(hit.any(axis=-1), t, np.inf)


def times(curves: np.ndarray, quality: float) -> float:
    """Seconds the mean of ``curves`` (seeds x validations x (seconds, error)) takes to ``quality``
    (inf: never)."""
    return float(first_times(curves.mean(axis=0), quality))


def family_diffs(rows: dict, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per resample (a row of seed indices in ``idx``): the synchronous family's time to quality
    less the asynchronous family's, F* and both picks made again from that resample's means; and
    the asynchronous pick's time (inf where it misses)."""
    sync, asyn = [m for m in rows if m in SYNC], [m for m in rows if m in ASYNC]
    means = {m: rows[m][idx].mean(axis=1) for m in rows}                # resamples x validations x 2
    fs = np.min([means[m][:, -1, 1] for m in sync], axis=0)
    ts = {m: first_times(means[m], fs + DELTA) for m in rows}
    a, s = np.min([ts[m] for m in asyn], axis=0), np.min([ts[m] for m in sync], axis=0)
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(a) & np.isinf(s), 0.0, s - a), a


def call(rows: dict) -> dict:
    """The family call over the seeds' bootstrap (``claims.resamples``, the same seeds for every
    method): per resample, F* (the least synchronous mean final error), each method's mean-curve
    time to F* + DELTA, each family's pick (its least), and the difference synchronous - asynchronous
    (a family that misses: inf on its side).  The interval: the expanded percentile interval
    (``claims.tail``) by order statistics (infinities allowed).  ``rows``: method -> array (seeds x
    validations x 2)."""
    sync = [m for m in rows if m in SYNC]
    asyn = [m for m in rows if m in ASYNC]
    if not sync or not asyn:
        return dict(outcome="neither" if not sync else "not run")
    n = len(SEEDS)
    idx = np.vstack([np.arange(n)[None, :], claims.resamples(n)])      # the observed, then the resamples
    diffs, a = family_diffs(rows, idx)
    boot = np.sort(diffs[1:])
    q = claims.tail(n)
    lo, hi = boot[int(np.floor(q * len(boot)))], boot[int(np.ceil((1 - q) * len(boot))) - 1]
    outcome = "sync" if hi < 0 else "async" if lo > 0 else "tie"
    return dict(outcome=outcome, diff=finite(diffs[0]), lo=finite(lo), hi=finite(hi), seeds=n,
                async_misses=float(np.isinf(a[1:]).mean()))


def cell(recs: dict, plan: Plan, network: str, condition: str, p: int) -> dict | None:
    """One cell: F*, per method its configuration, final error (mean, each seed), mean-curve times
    to quality, to the early target and to its end; the family call; where push-sum misses the
    quality, its end against the synchronous pick's time to push-sum's final error.  None while
    a run of it is missing; a method whose every seed diverged at once is listed as such."""
    ag = agents(network)
    got = reported(recs, plan, ag, p, network, condition)
    if got is None:
        return None
    arr = {m: padded([curves[s] for s in SEEDS]) for m, (_, curves) in got.items()}
    diverged = sorted(m for m, a in arr.items() if a is None)
    arr = {m: a for m, a in arr.items() if a is not None}
    if not any(m in arr for m in SYNC):
        return dict(network=network, condition=condition, p=p, agents=ag, noise_units=8 * p / B_NOISE,
                    fstar=None, methods={}, diverged=diverged, call=dict(outcome="neither"))
    fs = min(float(arr[m][:, -1, 1].mean()) for m in SYNC if m in arr)
    methods = {}
    for m, a in arr.items():
        fe = a[:, -1, 1]
        tq, t40 = times(a, fs + DELTA), times(a, TARGET)
        methods[m] = dict(config=got[m][0], final_error=float(fe.mean()), seeds=[float(x) for x in fe],
                          to_quality=None if not np.isfinite(tq) else tq,
                          to_target=None if not np.isfinite(t40) else t40,
                          end=float(a[:, -1, 0].mean()))
    out = dict(network=network, condition=condition, p=p, agents=ag, noise_units=8 * p / B_NOISE, fstar=fs,
               methods=methods, diverged=diverged, call=call(arr))
    sync = [m for m in SYNC if m in methods]
    pick = min(sync, key=lambda m: (methods[m]["to_quality"] is None, methods[m]["to_quality"] or 0.0))
    out["sync_pick"] = pick
    for m in ASYNC:
        v = methods.get(m)
        if v is not None and v["to_quality"] is None:
            t = times(arr[pick], v["final_error"])
            v["sync_to_its_error"] = None if not np.isfinite(t) else t
            v["end_ratio"] = None if not np.isfinite(t) else v["end"] / t
            v["error_gap"] = v["final_error"] - methods[pick]["final_error"]
    return out


def cells(recs: dict) -> list[dict]:
    plan = Plan(recs)
    out = []
    for ag in ("flat", "node"):
        for n in networks_of(ag):
            for cond in CONDITIONS:
                for p in sorted(ps_of(ag)):
                    c = cell(recs, plan, n, cond, p)
                    if c is not None:
                        out.append(c)
    return out


def run_flags(method: str, cfg: str, ag: str) -> str:
    """A reported configuration's flags as a user runs them: the method's, its rate rule and
    setting, the hierarchy, the schedule (not the budget: ``--epochs`` is the user's)."""
    return " ".join([*flags(method, cfg, ag), "--schedule", "cosine", "--warmup-epochs", f"{WARMUP:g}"])


def study_file(d: dict, recs: dict) -> dict:
    """What ``scalesgd plan`` reads for time to final quality (``PLAN_FILE``): per complete cell of
    ``summary()`` ``d``, F*, the quality F* + DELTA, the family call, and per method its settings and
    each seed's validation errors by global samples (a diverged seed carried at chance, as ``cell``
    carries it), which plan times on a user's clock.  A cell without a synchronous result (every
    seed diverged) is left out; so is one whose records changed since ``d`` was read."""
    plan = Plan(recs)
    cells = {}
    for c in d["cells"]:
        got = reported(recs, plan, c["agents"], c["p"], c["network"], c["condition"])
        if c["fstar"] is None or got is None:
            continue
        methods = {}
        for m, (cfg, curves) in got.items():
            arr = padded([curves[s] for s in SEEDS], x="samples")
            if arr is None or m not in c["methods"]:
                continue
            methods[m] = dict(config=cfg, flags=run_flags(m, cfg, c["agents"]),
                              final_error=c["methods"][m]["final_error"],
                              seeds={str(s): dict(final_error=float(a[-1, 1]),
                                                  curve=[[int(x), float(e)] for x, e in a])
                                     for s, a in zip(SEEDS, arr)})
        cells[f"{c['network']}/{c['condition']}/p{c['p']}"] = dict(
            agents=c["agents"], fstar=c["fstar"], quality=c["fstar"] + DELTA,
            call=c["call"]["outcome"], sync_pick=c.get("sync_pick"), diverged=c["diverged"], complete=True,
            missing=[], methods=methods)
    return dict(source="benchmarks/final_map.py report", metric="final", commits=[d["commit"]], E=E,
                delta=DELTA, target_error=TARGET,
                task=dict(job=(ROOT / "jobs" / "glyphs.toml").read_text(), train=51_200, val=5_000,
                          classes=10, eval_every=max(0.25, E / 16), name="the glyphs (jobs/glyphs.toml)",
                          schedule=f"cosine over {E} epochs after a {WARMUP:g}-epoch warm-up"),
                workers=sorted({*P, *NODE_P}), p=dict(flat=sorted(P), node=sorted(NODE_P)),
                networks=[*FLAT, *NODE], agents={n: agents(n) for n in (*FLAT, *NODE)},
                conditions=list(CONDITIONS), complete=d["least_left"] == 0, noise_scale=dict(b_noise=B_NOISE),
                cells=cells)


def ship(d: dict) -> None:
    """``report`` also writes ``PLAN_FILE`` from the same records."""
    f = study_file(d, records())
    PLAN_FILE.write_text(json.dumps(f) + "\n")
    print(f"wrote {PLAN_FILE.relative_to(ROOT)} ({len(f['cells'])} cells)")


# ------------------------------------------------------------------------------------- running
def pinned() -> str | None:
    return store.pinned(RESULTS)


def records() -> dict[str, dict]:
    """The records of the pinned commit at this budget E."""
    pin = pinned()
    return {k: r for k, r in store.records(RESULTS).items()
            if r.get("commit") == pin and r.get("epochs") == E}


# A likely twin's cost: its clock-only run (16-24 s at p = 32 beside another run, 24 records) with room
TWIN_COST_S = 60.0


def ident(r: dict) -> tuple:
    """A record's run but for its network and condition: (kind, method, agents, p, config, seed)."""
    return r["kind"], r["method"], r["agents"], r["workers"], r["config"], r["seed"]


def order_peers(recs: dict) -> set[frozenset]:
    """The pairs of networks whose push-sum runs of one configuration, seed, split and condition have
    had one event order in the records (under ``none``: titanx-fdr and a100-ib100)."""
    seen: dict[tuple, dict[str, str]] = {}
    for r in recs.values():
        if r["method"] in ASYNC and r.get("trace") and r.get("clock_same", True):
            seen.setdefault((*ident(r), r["condition"]), {})[r["network"]] = r["trace"]
    return {frozenset((a, b)) for by in seen.values() for a in by for b in by if a < b and by[a] == by[b]}


def likely_twin(run: tuple, recs: dict, peers: set[frozenset]) -> bool:
    """Whether a push-sum run will likely find its twin: a record of it on a network that has shared
    its event order with the run's (``order_peers``).  Only its cost and the projection use this:
    whether it is one is decided by its clock-only run (``twin``)."""
    network, condition = run[6:]
    return run[1] in ASYNC and any(
        ident(r) == run[:6] and r["condition"] == condition and frozenset((r["network"], network)) in peers
        and r.get("clock_same", True) for r in recs.values())


def run_cost(run: tuple, recs: dict | None = None, peers: set | None = None) -> float:
    """Seconds ``run`` is planned to take: a likely twin's clock-only run, else a whole run."""
    if recs is not None and likely_twin(run, recs, order_peers(recs) if peers is None else peers):
        return TWIN_COST_S
    return F.epoch_cost(E)


def execute(run: tuple, sha: str, wt: Path, dirs: dict, scratch: Path) -> dict:
    """One run of the pinned tree; a synchronous one re-timed under every network of its kind and
    every condition, a push-sum one re-timed from its twin where it has one (``twin``); writes its
    record."""
    kind, method, ag, p, cfg, seed, network, condition = run
    rkey = run_key(kind, method, ag, p, cfg, seed, network, condition)
    net = network or networks_of(ag)[0]
    run_dir = scratch / rkey
    args = ["--data", str(dirs["tune" if kind == "tune" else "sweep"]), *flags(method, cfg, ag),
            "--schedule", "cosine", "--warmup-epochs", str(WARMUP), "--seed", str(seed), "--workers", str(p),
            "--epochs", str(E), "--eval-every", f"{max(0.25, E / 16):g}", "--profile", net,
            "--condition", condition or TUNE_CONDITION]
    clock = driver.clock_trace(wt, scratch / f"{rkey}-clock", args) if method in ASYNC else None
    donor = twin(records(), run, clock["trace"]) if clock else None
    if donor is not None:
        rec = retimed(run, donor, clock)
        rec.update(argv=driver.shown_argv(wt, driver.glyph_argv(wt, run_dir, args)[0]), commit=sha)
        store.write(RESULTS, rkey, rec)
        return rec
    got = driver.glyph_run(wt, rkey, run_dir, args)
    curve = [dict(samples=v["global_samples"], seconds=v["train_seconds"], error=1 - v["val_top1_accuracy"])
             for v in driver.vals(run_dir)]
    rec = dict(key=rkey, kind=kind, method=method, agents=ag, workers=p, config=cfg, seed=seed,
               network=network, condition=condition, epochs=E, argv=got["argv"], diverged=got["diverged"],
               final_error=curve[-1]["error"] if curve and not got["diverged"] else 0.9, curve=curve)
    if method in SYNC:
        try:                      # (a diverged run's tape may end where it stopped: re-timed if it can be)
            rec["retimed"] = driver.retime(run_dir, wt, got["env"], networks_of(ag), CONDITIONS)
        except subprocess.CalledProcessError:
            if not got["diverged"]:
                raise
    else:                         # (its event order, and whether the clock-only run had its order and clock)
        rec.update(trace=clock_trace.trace_digest(run_dir), clock_trace=clock["trace"],
                   clock_seconds=clock["seconds"],
                   clock_same=[[c["samples"], c["seconds"]] for c in curve] == clock["history"][:len(curve)])
    rec.update(commit=sha, real_seconds=time.perf_counter() - got["t0"] + (clock["seconds"] if clock else 0))
    store.write(RESULTS, rkey, rec)
    shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def twin(recs: dict, run: tuple, trace: str) -> dict | None:
    """A push-sum run's *twin*: a record of the same configuration, seed and split (another network or
    condition) whose run had the event order ``trace`` (its trace's digest), and whose clock-only run
    had that order and clock too.  A replay redoes a run from its order alone, so the twin's
    numbers are this run's: only the clock differs (under ``none`` the runs on titanx-fdr and
    a100-ib100 have one order: every push lands before its target's next drain)."""
    for r in recs.values():
        same_order = r.get("trace") == trace == r.get("clock_trace") and r.get("clock_same", True)
        if ident(r) == run[:6] and same_order:
            return r
    return None


def retimed(run: tuple, donor: dict, clock: dict) -> dict:
    """The record of ``run`` from its twin ``donor``: the twin's errors at the clock-only run's times
    (the same validations: their sample counts must agree)."""
    kind, method, ag, p, cfg, seed, network, condition = run
    hist = clock["history"][:len(donor["curve"])]
    if [c["samples"] for c in donor["curve"]] != [h[0] for h in hist]:
        raise RuntimeError(f"{donor['key']}: its validations are not the clock-only run's")
    curve = [dict(samples=s, seconds=t, error=c["error"]) for (s, t), c in zip(hist, donor["curve"])]
    return dict(key=run_key(*run), kind=kind, method=method, agents=ag, workers=p, config=cfg, seed=seed,
                network=network, condition=condition, epochs=E, diverged=donor["diverged"],
                final_error=donor["final_error"], curve=curve, retimed_from=donor["key"],
                trace=clock["trace"], clock_trace=clock["trace"], real_seconds=clock["seconds"])


def piece(minutes: float, jobs: int, data: Path, scratch: Path) -> int:
    sha = pinned() or sys.exit("final_map: no pinned commit yet: python benchmarks/final_map.py pin")
    wt = driver.tree(sha)
    dirs = driver.data_dirs(data)
    now: dict = {}

    def ready() -> list[tuple]:
        plan = Plan()
        now.update(recs=plan.recs, peers=order_peers(plan.recs))
        return plan.todo()
    driver.run_pool(jobs, minutes, ready, lambda r: execute(r, sha, wt, dirs, scratch),
                    lambda r: run_cost(r, now["recs"], now["peers"]), lambda r: run_key(*r),
                    lambda r, rec: f"{rec['key']}: final error {rec['final_error']:.4f}, "
                                   f"{rec['real_seconds']:.0f} s real")
    return status()


def least_left(plan: Plan, s: Search) -> int:
    """The fewest runs ``s`` still needs: its grid's missing tuning runs (a grid not begun: 3
    rates, and local SGD's settings step), and its reported runs at one choice (the choices made,
    where they are)."""
    cfgs, over = s.grid()
    untried = 0 if over else len(set(SETTINGS[s.method]) - {parse(c)[1] for c in cfgs})
    tune = (len(cfgs) or 3) + untried - (0 if cfgs else 1)
    if s.method == "allreduce" and s.ag == "node":
        tune = 0
    done = sum(s.key(c, seed) in plan.recs for c in cfgs for seed in TUNE_SEEDS)
    choices = plan.choices(s) or {None}
    conds = ASYNC_CONDITIONS if s.network else (None,)
    rep = sum(c is None or run_key("rep", s.method, s.ag, s.p, c, seed, s.network, cond) not in plan.recs
              for c in choices for cond in conds for seed in SEEDS)
    return max(tune * len(TUNE_SEEDS) - done, 0) + rep


def summary(recs: dict | None = None) -> dict:
    recs = records() if recs is None else recs
    plan = Plan(recs)
    todo = plan.todo()
    tuning, left = {}, 0
    for s in plan.lines():
        cfgs, over = s.grid()
        tuning[f"{s.method}/{s.ag}/p{s.p}" + (f"/{s.network}" if s.network else "")] = dict(
            configs={c: None if s.runs(c) is None else [g["final_error"] for g in s.runs(c)] for c in cfgs},
            over=over, chosen=sorted(plan.choices(s)))
        left += least_left(plan, s)
    hours = sum(r.get("real_seconds", 0.0) for r in recs.values()) / 3600
    twins = [r for r in recs.values() if r.get("retimed_from") in recs]
    saved = sum(recs[r["retimed_from"]]["real_seconds"] - r["real_seconds"] for r in twins) / 3600
    peers = order_peers(recs)
    likely = sum(likely_twin(r, recs, peers) for r in todo)
    ready_s = sum(run_cost(r, recs, peers) for r in todo)
    return dict(experiment="final-map", commit=pinned(), E=E, delta=DELTA, seeds=list(SEEDS),
                tune_seeds=list(TUNE_SEEDS), b_noise=B_NOISE, runs=len(recs), machine_hours=hours,
                twins=dict(runs=len(twins), machine_hours_saved=saved, likely_ready=likely),
                ready=len(todo), ready_hours=ready_s / 3600, least_left=left,
                least_left_hours=(left * F.epoch_cost(E) - likely * (F.epoch_cost(E) - TWIN_COST_S)) / 3600,
                tuning=tuning, cells=cells(recs))


def status() -> int:
    d = summary()
    print(f"final map at E = {d['E']}: {d['runs']} runs ({d['twins']['runs']} re-timed from a twin, "
          f"{d['twins']['machine_hours_saved']:.2f} machine-hours saved), {d['machine_hours']:.2f} "
          f"machine-hours; ready now "
          f"{d['ready']} runs, {d['twins']['likely_ready']} of them likely twins (about "
          f"{d['ready_hours']:.1f} machine-hours); at least {d['least_left']} runs left (about "
          f"{d['least_left_hours']:.1f} machine-hours at {1000 * F.STEP_COST_S:.0f} ms a worker-step, "
          "a twin not yet ready counted as a whole run)")
    for name, t in d["tuning"].items():
        print(f"  {name}: {len(t['configs'])} configurations, "
              f"{'over, chosen ' + ', '.join(t['chosen']) if t['over'] else 'open'}")
    for c in d["cells"]:
        print(f"  {c['network']} / {c['condition']} p = {c['p']}: F* {c['fstar']:.2%}, "
              f"call {c['call']['outcome']}")
    return 0


def main(argv=None) -> int:
    return driver.study_main(argv, __doc__, "final_map", RESULTS, pinned, piece, summary, OUT, status,
                             "final-map", also=ship)


if __name__ == "__main__":
    sys.exit(main())
