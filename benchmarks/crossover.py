#!/usr/bin/env python3
"""The crossover study, done fairly (issue 37): which method reaches a target error first, by p,
network and variability, every method at its best after the same search.

    python benchmarks/crossover.py pin [COMMIT]            # the code every run of the study uses
    python benchmarks/crossover.py run [--minutes 55]      # one resumable piece (2 runs at a time)
    python benchmarks/crossover.py status                  # what is done, what is left, the hours
    python benchmarks/crossover_report.py                  # the map, the verdicts (progress; --final)

**Task.** The procedural glyphs (``benchmarks/glyphs.py``: 51,200 training images, 10 classes,
16x16), ``jobs/glyphs.toml`` (ResNet-8 at half width, batch 8 per worker), a constant rate after an
optional warm-up, target: ``TARGET`` top-1 error.  Every run is a virtual-cluster run (the real
method code, simulated time) from the pinned commit (``pin.json``; a git worktree of it under
``runs/``), ends at its first validation at or below the target (``--stop-at-error``) or at its
horizon, and leaves a JSON record under ``benchmarks/results/crossover/`` with that commit.

**Axes.** p in ``WORKERS`` (and one worker); the networks ``NETWORKS`` (the papers' era, a current
InfiniBand cluster, SGP's 10 Gbit/s Ethernet); the conditions ``CONDITIONS`` (no variability, a
typical cluster's, Jin et al.'s stragglers).  All-reduce, local SGD and one worker compute the same
numbers under any clock, so each of their runs is *re-timed* exactly under all nine
(network, condition) pairs; the asynchronous methods run under each pair of their own.

**The same search for every method** (``GRIDS``): 4 configurations per method and p, two with a
fixed rate and two with linear scaling by the global batch and a warm-up (``--linear-scaling``, the
same option for every method; A-SGD's rates are its own rule's, one worker's grid four fixed rates),
the method's own settings spread over them (EASGD's beta, tau and
servers K; A-SGD's n_sync and K; local SGD's tau and SlowMo), then ``ADAPTIVE`` more for every
method, one at a time from the choice so far: past the grid's edge when the choice sits on one (a
choice at an edge extends the grid), else halfway to its better neighbour; then the choice's rate
with the method's other settings (one more rate step for a method without settings of its own);
then, while a choice under some network still sits on an edge, up to ``EDGE_MORE`` more past it
(``Study.grid``).  Each configuration: ``TUNE_SEEDS`` seeds on the *tune* split under
``TUNE_NETWORK`` / ``TUNE_CONDITION``.  Selection is by **time to target**, per network: exactly
(re-timed) for the synchronous methods; for the asynchronous ones samples to target times the
configuration's seconds per sample under that network (a ``time`` run of it there).  A
configuration that missed the target in a tuning seed ranks after every one that reached it.

**Reported runs** (``sweep``): each method's configuration chosen for the network, ``SEEDS`` seeds
(the same seeds for every method: paired) on the main split, under every condition; seeds
``MORE_SEEDS`` too for every method of a cell whose mean is within ``CLOSE`` of the fastest's
(ranked over ``SEEDS``, then, once their extra seeds are in, again over every seed each method has;
the driver's plan repeats that until no new method is close).  The authors' rows (``AUTHORS``) get
``MORE_SEEDS`` by the same rule among the rows J1 and J2 compare, and P1's two sides (one worker; A-SGD at
``P1_P``, tuned under ``TUNE_CONDITION`` on every network and the authors' form) always.
Horizons: a tuning run ends at ``CAP_SAMPLES`` x the samples the most sample-efficient
configuration at that p needed; a reported asynchronous run at ``CAP_TIME`` x the best synchronous
method's time in its cell (a method that needs more cannot be the fastest; it is reported with
the error it reached).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "crossover"
PIN = RESULTS / "pin.json"

TARGET = 0.40
WORKERS = (2, 4, 8, 16, 32, 64, 128)
NETWORKS = ("titanx-fdr-resnet18", "a100-ib100-resnet50", "v100-10gbe-resnet50")
CONDITIONS = ("none", "typical", "stragglers")
TUNE_NETWORK, TUNE_CONDITION = "a100-ib100-resnet50", "typical"
TUNE_SEEDS = (100, 101)
SEEDS = (0, 1)
MORE_SEEDS = (2, 3, 4)
CLOSE = 1.25                 # "the two fastest within 25%": more seeds
EVAL_EVERY = 0.25            # epochs between validations (the time to target is interpolated)
CAP_SAMPLES = 3.0            # tuning horizon: x the fewest samples to target at that p
CAP_TIME = 2.0               # reported asynchronous runs: x the best synchronous time in the cell
MAX_EPOCHS, MIN_EPOCHS = 12, 3
TIMING_TRAIN = 25_600        # the timing runs' data set (one epoch)
ADAPTIVE = 2                 # rate steps added to each method's grid at each p (the same for all)
EDGE_MORE = 2                # at most this many more past an edge a choice still sits on
STEP_COST_S = 0.0055         # real seconds per worker-step, two runs at a time (for planning only)

SYNC = ("single", "allreduce", "localsgd")          # re-timed: arithmetic independent of the clock
ASYNC = ("easgd", "asgd", "gossip-pull", "pushsum-ov")
METHODS = ("allreduce", "localsgd", *ASYNC)
LSW = ["--linear-scaling", "--reference-batch", "8", "--warmup-epochs", "0.5"]
FIXED = {"single": ["--method", "single"],
         "allreduce": ["--method", "allreduce"],
         "localsgd": ["--method", "localsgd"],
         "easgd": ["--method", "easgd"],
         "asgd": ["--method", "asgd"],
         # blocking pull with the shipped progress default (a progress thread across nodes)
         "gossip-pull": ["--method", "gossip", "--gossip", "pull", "--gossip-graph", "uniform"],
         # the authors' blocking pull as they ran it: nothing keeps a computing target's MPI progressing
         "gossip-pull-np": ["--method", "gossip", "--gossip", "pull", "--gossip-graph", "uniform",
                            "--mpi-progress", "none"],
         # SGP's form: push-sum on the exponential graph, the exchange overlapped with the next step
         "pushsum-ov": ["--method", "gossip", "--gossip", "push", "--gossip-overlap",
                        "--gossip-graph", "exponential"]}
KNOBS = {"": [],
         "t4": ["--tau", "4"], "t16m": ["--tau", "16", "--slowmo-beta", "0.6"],
         "e1": ["--tau", "1", "--beta", "0.8", "--servers", "1"],        # the authors' EASGD
         "e4": ["--tau", "4", "--beta", "0.9", "--servers", "4"],        # less often, sharded
         "a1": ["--n-sync", "1", "--servers", "1"],                      # Paine et al.'s A-SGD
         "a4": ["--n-sync", "4", "--servers", "4"]}
# (rule, rate, knob): F = fixed rate, L = linear scaling with warm-up (peak = rate x 8p / 8),
# W = A-SGD's own fixed rule, rate / p (its server adds every worker's update)
GRIDS = {"single": [("F", 0.025, ""), ("F", 0.05, ""), ("F", 0.1, ""), ("F", 0.2, "")],
         "allreduce": [("F", 0.05, ""), ("F", 0.2, ""), ("L", 0.05, ""), ("L", 0.0125, "")],
         "gossip-pull": [("F", 0.05, ""), ("F", 0.2, ""), ("L", 0.05, ""), ("L", 0.0125, "")],
         "pushsum-ov": [("F", 0.05, ""), ("F", 0.2, ""), ("L", 0.05, ""), ("L", 0.0125, "")],
         "localsgd": [("F", 0.05, "t4"), ("F", 0.2, "t16m"), ("L", 0.05, "t16m"), ("L", 0.0125, "t4")],
         "easgd": [("F", 0.05, "e1"), ("F", 0.2, "e4"), ("L", 0.05, "e4"), ("L", 0.0125, "e1")],
         "asgd": [("W", 0.2, "a1"), ("W", 0.8, "a4"), ("L", 0.0125, "a4"), ("L", 0.003125, "a1")]}


# The papers' own forms, fixed (no tuning), as their own rows for the "authors' forms" verdicts:
# name -> (method, config), run under the papers' era network, without and with stragglers
AUTHORS = {"allreduce-authors": ("allreduce", "F0.05"),          # Jin et al.'s all-reduce, fixed rate
           "easgd-authors": ("easgd", "F0.05-e1"),               # beta 0.8, tau 1, one server
           "gossip-authors": ("gossip-pull-np", "F0.05"),        # blocking pull, no progress thread
           "asgd-authors": ("asgd", "W0.2-a1")}                  # Paine et al.: n_sync 1, one server
AUTHORS_NETWORK, AUTHORS_CONDITIONS = "titanx-fdr-resnet18", ("none", "stragglers")
# J1's and J2's sides
AUTHORS_SYNC, AUTHORS_ASYNC = ("allreduce-authors",), ("easgd-authors", "gossip-authors")
P1_P = 8                     # P1 (Paine et al.): A-SGD on 8 GPUs against one
# P3 (Paine et al.: a larger n_sync communicates less, coarser but still training): 4 clients, the
# whole horizon (no stop at the target), long enough that n_sync 100 makes >= 50 exchanges per client
# (1,600 steps an epoch each)
NSYNC = {f"n{n}": n for n in (1, 10, 100)}
NSYNC_P, NSYNC_EPOCHS, NSYNC_SEEDS = 4, 4, (0, 1, 2)
KNOBS.update({f"a{n}": ["--n-sync", str(n), "--servers", "1"] for n in (10, 100)})


def is_sync(method: str) -> bool:
    """Whether ``method`` (or the authors' row of one) computes the same numbers under any clock."""
    return method in SYNC or AUTHORS.get(method, ("",))[0] in SYNC


def cname(rule: str, rate: float, knob: str) -> str:
    return f"{rule}{rate:g}" + (f"-{knob}" if knob else "")


def parse(config: str) -> tuple[str, float, str]:
    head, _, knob = config.partition("-")
    return head[0], float(head[1:]), knob


def flags(method: str, config: str, p: int) -> list[str]:
    if method in AUTHORS:
        method, config = AUTHORS[method]
    rule, rate, knob = parse(config)
    lr = rate / p if rule == "W" else rate
    return [*FIXED[method], "--lr", f"{lr:.6g}", *(LSW if rule == "L" else []), *KNOBS[knob]]


def pinned() -> str | None:
    """The pinned commit (``RESULTS/pin.json``), None before one is pinned."""
    try:
        return json.loads((RESULTS / PIN.name).read_text())["commit"]
    except (OSError, ValueError, KeyError):
        return None


def commit() -> str:
    return pinned() or sys.exit("crossover: no pinned commit yet: "
                                "python benchmarks/crossover.py pin [COMMIT]")


@dataclass(frozen=True)
class Run:
    kind: str                # tune | time | sweep
    method: str
    workers: int
    config: str
    seed: int
    network: str
    condition: str
    epochs: int = field(default=0, compare=False)

    @property
    def key(self) -> str:
        where = "" if is_sync(self.method) and self.kind != "time" else f"-{self.network}-{self.condition}"
        return f"{self.kind}/{self.method}-p{self.workers}-{self.config}-s{self.seed}{where}"

    @property
    def record(self) -> Path:
        return RESULTS / f"{self.key}.json"

    @property
    def cost(self) -> float:
        n = TIMING_TRAIN if self.kind == "time" else 51_200
        return max(self.epochs, 1) * n / 8 * STEP_COST_S


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def interpolate(curve: list[dict], key: str, target: float = TARGET) -> float | None:
    """``key`` (samples or seconds) where the validation error first reaches ``target``: linear
    between the last validation above it and the first at or below it."""
    prev = None
    for c in curve:
        if c["error"] <= target:
            if prev is None or prev["error"] <= c["error"]:
                return float(c[key])
            f = (prev["error"] - target) / (prev["error"] - c["error"])
            return float(prev[key] + f * (c[key] - prev[key]))
        prev = c
    return None


def seconds_to(rec: dict, network: str, condition: str) -> float | None:
    """A record's time to target under (network, condition): its own clock or a re-timing."""
    if is_sync(rec["method"]):
        times = rec.get("retimed", {}).get(f"{network}/{condition}")
        if times is None:
            return None
        curve = [dict(c, seconds=t) for c, t in zip(rec["curve"], times)]
        return interpolate(curve, "seconds")
    if (rec["network"], rec["condition"]) != (network, condition):
        return None
    return interpolate(rec["curve"], "seconds")


# ---------------------------------------------------------------------------------------- the plan
class Study:
    """What has been done (the records) and what can run next."""

    def __init__(self):
        """Loads the records; one of another commit than the pinned one (``foreign``) is left out,
        as if it had not run."""
        self.recs: dict[str, dict] = {}
        self.foreign: list[str] = []
        pin = pinned()
        for f in RESULTS.glob("*/*.json"):
            r = load(f)
            if r is not None and "key" in r:
                if pin is not None and r.get("commit") != pin:
                    self.foreign.append(r["key"])
                else:
                    self.recs[r["key"]] = r
        self.open_cells: set[tuple[int, str, str]] = set()     # (p, network, condition), by plan()

    def get(self, run: Run) -> dict | None:
        return self.recs.get(run.key)

    # ---- tuning
    def grid(self, method: str, p: int) -> list[str]:
        """The configurations tuned for (method, p), one at a time, each from the choice so far:

        1. the base grid (``GRIDS``: 4 points, the method's settings paired with rates);
        2. ``ADAPTIVE`` more, placed by ``next_point`` from the choice under the tuning network;
        3. the *settings step*: the choice's rule and rate with the method's other settings
           (``other_settings``), since the base grid pairs each setting with two rates only and a
           setting paired with rates that fail at some p would otherwise never be tried at a rate
           that works (A-SGD's sharded server at p >= 8, say); a method without settings of its own
           gets one more ``next_point`` instead, so that every method gets the same number;
        4. a choice under any network still at an edge of its rule's rates extends the grid past
           that edge, up to ``EDGE_MORE`` times (only here can two methods' counts differ)."""
        return self.grid_state(method, p)[0]

    def grid_state(self, method: str, p: int) -> tuple[list[str], bool]:
        """(``grid``'s configurations so far, whether the search is over: False while a choice it
        depends on waits for runs, under any network, so that no choice is taken from a grid that
        may still grow)."""
        out = [cname(*g) for g in GRIDS[method]]
        for step in range(ADAPTIVE + 1):
            c = self.chosen(method, p, TUNE_NETWORK, out)
            if c is None:
                return out, False
            nxt = self.other_settings(method, out, c) if step == ADAPTIVE else None
            nxt = nxt or self.next_point(method, p, out, c)
            if nxt is None:
                break
            out.append(nxt)
        for k in range(EDGE_MORE + 1):
            chosen = [self.chosen(method, p, n, out) for n in NETWORKS]
            if None in chosen:
                return out, False
            edge = next((c for c in chosen if self.on_edge(c, out)), None)
            nxt = edge and self.next_point(method, p, out, edge)
            if nxt is None or k == EDGE_MORE:
                break
            out.append(nxt)
        return out, True

    @staticmethod
    def other_settings(method: str, grid: list[str], config: str) -> str | None:
        """``config``'s rule and rate with the method's other settings in its base grid (None: it
        has none, or that configuration is tuned already)."""
        rule, rate, knob = parse(config)
        others = sorted({g[2] for g in GRIDS[method]} - {knob})
        c = others and cname(rule, rate, others[0])
        return c if c and c not in grid else None

    @staticmethod
    def on_edge(config: str, grid: list[str]) -> bool:
        """Whether ``config``'s rate is the highest or lowest of its rule's in ``grid``."""
        rule, rate, _ = parse(config)
        rates = [r for c in grid for (ru, r, _) in [parse(c)] if ru == rule]
        return rate >= max(rates) or rate <= min(rates)

    def next_point(self, method: str, p: int, grid: list[str], config: str) -> str | None:
        """The next configuration to try: past the edge ``config`` sits on (its rate x2 or /2,
        its rule and settings); inside the grid, the rate halfway (geometrically) towards the
        better-scoring neighbouring rate of its rule, else towards the other one."""
        rule, rate, knob = parse(config)
        rates = sorted({r for c in grid for (ru, r, _) in [parse(c)] if ru == rule})
        if rate >= rates[-1]:
            cands = [rate * 2]
        elif rate <= rates[0]:
            cands = [rate / 2]
        else:
            i = rates.index(rate)

            def best(r):                      # the best score of the rule's configurations at rate r
                sc = [self.score(method, p, c, TUNE_NETWORK) for c in grid if parse(c)[:2] == (rule, r)]
                return min((x for x in sc if x is not None), default=(2, 0.0))
            lo, hi = rates[i - 1], rates[i + 1]
            order = (lo, hi) if best(lo) <= best(hi) else (hi, lo)
            cands = [math.sqrt(rate * r) for r in order]
        for r in cands:
            c = cname(rule, float(f"{r:.4g}"), knob)
            if c not in grid:
                return c
        return None

    def tune_runs(self, method: str, p: int, configs) -> list[Run]:
        net, cond = (TUNE_NETWORK, TUNE_CONDITION)
        return [Run("tune", method, p, c, s, net, cond) for c in configs for s in TUNE_SEEDS]

    def time_runs(self, method: str, p: int, configs) -> list[Run]:
        if method in SYNC:
            return []
        return [Run("time", method, p, c, 0, n, TUNE_CONDITION) for c in configs for n in NETWORKS
                if n != TUNE_NETWORK]

    def score(self, method: str, p: int, config: str, network: str):
        """Tuning score under ``network`` (lower is better), or None while runs are missing."""
        recs = [self.get(r) for r in self.tune_runs(method, p, [config])]
        if any(r is None for r in recs):
            return None
        if method not in SYNC and network != TUNE_NETWORK:
            t = self.get(Run("time", method, p, config, 0, network, TUNE_CONDITION))
            if t is None:
                return None
        times = []
        for r in recs:
            if method in SYNC or network == TUNE_NETWORK:
                times.append(seconds_to(r, network, TUNE_CONDITION))
            else:
                s = interpolate(r["curve"], "samples")
                times.append(None if s is None else s * t["seconds_per_sample"])
        if any(x is None for x in times):
            return (1, sum(r["final_error"] for r in recs) / len(recs))
        return (0, sum(times) / len(times))

    def chosen(self, method: str, p: int, network: str, grid: list[str] | None = None) -> str | None:
        """The best-scoring configuration of ``grid`` (default: the method's whole search, None
        until it is over) under ``network``; None while one of them waits for runs."""
        if grid is None:
            grid, final = self.grid_state(method, p)
            if not final:
                return None
        scores = {c: self.score(method, p, c, network) for c in grid}
        if any(s is None for s in scores.values()):
            return None
        return min(grid, key=lambda c: scores[c])

    def chosen_so_far(self, method: str, p: int, network: str) -> str | None:
        """The choice among the configurations whose tuning runs are all in (None: none is): what
        a cell reports, marked open, while the rest of its method's search is still to come."""
        scores = {c: self.score(method, p, c, network) for c in self.grid(method, p)}
        done = [c for c, v in scores.items() if v is not None]
        return min(done, key=lambda c: scores[c]) if done else None

    def best_samples(self, p: int) -> float | None:
        """The fewest mean samples to target of any configuration tuned at p (both seeds)."""
        best = None
        for m in (("single",) if p == 1 else METHODS):
            for c in self.grid(m, p):
                recs = [self.get(r) for r in self.tune_runs(m, p, [c])]
                s = [interpolate(r["curve"], "samples") for r in recs if r is not None]
                if len(s) == len(TUNE_SEEDS) and None not in s:
                    v = sum(s) / len(s)
                    best = v if best is None else min(best, v)
        return best

    def tune_epochs(self, p: int, samples_per_epoch: int = 51_200) -> int | None:
        b = self.best_samples(p)
        if b is None:                        # (every pilot done and none reached it: the longest)
            pilots = self.tune_runs("single", 1, GRIDS["single"]) if p == 1 else self.tune_runs(
                "allreduce", p, [cname(*g) for g in GRIDS["allreduce"] if g[0] == "L"])
            return MAX_EPOCHS if all(self.get(r) is not None for r in pilots) else None
        return max(MIN_EPOCHS, min(MAX_EPOCHS, math.ceil(CAP_SAMPLES * b / samples_per_epoch)))

    # ---- reported runs
    def cell_sync_best(self, p: int, network: str, condition: str) -> float | None:
        best = None
        for m in (("single",) if p == 1 else ("allreduce", "localsgd")):
            c = self.chosen(m, p, network)
            if c is None:
                return None
            ts = []
            for s in SEEDS:
                r = self.get(Run("sweep", m, p, c, s, network, condition))
                if r is None:
                    return None
                ts.append(seconds_to(r, network, condition))
            if None not in ts:
                v = sum(ts) / len(ts)
                best = v if best is None else min(best, v)
        return best

    def sweep_epochs(self, method: str, p: int, config: str, network: str, condition: str) -> int | None:
        if method in SYNC:
            e = self.tune_epochs(p)
            return None if e is None else min(MAX_EPOCHS, e + 2)
        best = self.cell_sync_best(p, network, condition)
        if best is None:                     # (no synchronous method reached it: the longest)
            return MAX_EPOCHS if self.sync_done(p, network, condition) else None
        spp = self.seconds_per_sample(method, p, config, network)
        if spp is None:
            return None
        return max(2, min(MAX_EPOCHS, math.ceil(CAP_TIME * best / spp / 51_200)))

    def authors_epochs(self, name: str, p: int, condition: str) -> int | None:
        """The authors' rows: the synchronous one as a tuned synchronous sweep; the asynchronous ones
        capped at CAP_TIME x the best tuned synchronous time of their cell, as the sweeps."""
        m, c = AUTHORS[name]
        if m in SYNC:
            return self.sweep_epochs(m, p, c, AUTHORS_NETWORK, condition)
        best = self.cell_sync_best(p, AUTHORS_NETWORK, condition)
        if best is None:
            return MAX_EPOCHS if self.sync_done(p, AUTHORS_NETWORK, condition) else None
        spp = self.seconds_per_sample("gossip-pull" if m == "gossip-pull-np" else m, p, c, AUTHORS_NETWORK)
        if spp is None:                      # (the tuned method's same configuration: its speed)
            return None
        return max(2, min(MAX_EPOCHS, math.ceil(CAP_TIME * best / spp / 51_200)))

    def sync_done(self, p: int, network: str, condition: str) -> bool:
        for m in (("single",) if p == 1 else ("allreduce", "localsgd")):
            c = self.chosen(m, p, network)
            if c is None or any(self.get(Run("sweep", m, p, c, s, network, condition)) is None
                                for s in SEEDS):
                return False
        return True

    def seconds_per_sample(self, method: str, p: int, config: str, network: str) -> float | None:
        if network == TUNE_NETWORK:
            recs = [self.get(r) for r in self.tune_runs(method, p, [config])]
            if any(r is None for r in recs):
                return None
            return sum(r["seconds_per_sample"] for r in recs) / len(recs)
        t = self.get(Run("time", method, p, config, 0, network, TUNE_CONDITION))
        return None if t is None else t["seconds_per_sample"]

    def authors_seed_times(self, p: int, name: str, condition: str) -> dict[int, float | None]:
        """An authors' row's recorded seeds under ``condition`` (its synchronous one re-timed)."""
        m, c = AUTHORS[name]
        run_cond = TUNE_CONDITION if m in SYNC else condition
        out = {}
        for s in (*SEEDS, *MORE_SEEDS):
            r = self.get(Run("authors", name, p, c, s, AUTHORS_NETWORK, run_cond))
            if r is not None:
                out[s] = seconds_to(r, AUTHORS_NETWORK, condition)
        return out

    def authors_close(self, p: int, condition: str) -> list[str]:
        """The authors' rows that get ``MORE_SEEDS`` at (p, condition): the cells' rule, among the rows
        J1 and J2 compare (A-SGD's is P1's, which gives it its own seeds)."""
        return self.close_of({name: self.authors_seed_times(p, name, condition)
                              for name in (*AUTHORS_SYNC, *AUTHORS_ASYNC)})

    def seed_times(self, p: int, network: str, condition: str, method: str) -> dict[int, float | None]:
        """The method's recorded seeds in the cell: seed -> time to target (None: it missed)."""
        c = self.chosen(method, p, network)
        out = {}
        for s in (*SEEDS, *MORE_SEEDS):
            r = None if c is None else self.get(Run("sweep", method, p, c, s, network, condition))
            if r is not None:
                out[s] = seconds_to(r, network, condition)
        return out

    def close_methods(self, p: int, network: str, condition: str) -> list[str]:
        """The methods of the cell that get ``MORE_SEEDS``: every method whose mean is within CLOSE
        of the fastest's (the fastest too, when there is one such), ranked over ``SEEDS``; once
        their extra seeds are all in, ranked again over every seed each method has (a method that
        missed a seed is not ranked, as in the report).  So no method within CLOSE of the fastest
        is judged on two seeds.  The second ranking carries the rule to the cell as reported: extra
        seeds can move another method, with two seeds, within CLOSE of the new leader, and it gets
        them too (on the next call; each call ranks once more, and every method gets its extra
        seeds at most once)."""
        return self.close_of({m: self.seed_times(p, network, condition, m) for m in METHODS if p > 1})

    @staticmethod
    def close_of(times: dict[str, dict[int, float | None]]) -> list[str]:
        """``close_methods``' rule on rows' seed times (name -> seed -> seconds, None: missed)."""
        def two_close(means: dict) -> list[str]:
            ranked = sorted(means, key=means.get)
            near = [m for m in ranked if means[m] <= CLOSE * means[ranked[0]]] if ranked else []
            return near if len(near) >= 2 else []

        def mean(ts: list) -> float | None:
            return None if not ts or None in ts else sum(ts) / len(ts)

        first = {m: v for m, t in times.items() for v in [mean([t.get(s) for s in SEEDS])] if v is not None}
        out = two_close(first)
        extra = {m: sum(s in t for s in MORE_SEEDS) for m, t in times.items()}
        partial = [m for m, k in extra.items() if 0 < k < len(MORE_SEEDS)]
        if partial or any(extra[m] < len(MORE_SEEDS) for m in out):
            return out + [m for m in partial if m not in out]       # (their extra seeds still running)
        every = {m: v for m, t in times.items() if all(s in t for s in SEEDS)
                 for v in [mean(list(t.values()))] if v is not None}
        return out + [m for m in two_close(every) if m not in out]

    # ---- everything, in order
    def plan(self) -> tuple[list[Run], list[str]]:
        """(runs that can start now, in order; what waits and for what)."""
        ready, waiting = [], []
        self.open_cells = set()
        self.open_authors = set()                           # (p, condition): an authors' run to come
        choice: dict[tuple[str, int, str], str | None] = {}     # (method, p, network) -> its choice

        def want(run: Run, epochs: int | None, why: str) -> None:
            if self.get(run) is not None:
                return
            if run.kind == "authors":
                self.open_authors |= {(run.workers, c) for c in
                                      (AUTHORS_CONDITIONS if is_sync(run.method) else (run.condition,))}
            if run.kind == "sweep":           # (a synchronous run serves every condition's cell, and
                nets = [run.network]          # every network's whose choice it is)
                if run.method in SYNC:
                    nets += [n for n in NETWORKS
                             if n != run.network and choice[run.method, run.workers, n] == run.config]
                self.open_cells |= {(run.workers, n, c) for n in nets
                                    for c in (CONDITIONS if run.method in SYNC else (run.condition,))}
            if epochs is None:
                waiting.append(f"{run.key}: {why}")
            else:
                ready.append(Run(**{**run.__dict__, "epochs": epochs}))

        for p in (1, *WORKERS):
            methods = ("single",) if p == 1 else METHODS
            cap = self.tune_epochs(p)
            for m in methods:
                grid = self.grid(m, p)
                for r in self.tune_runs(m, p, grid):
                    # pilots (all-reduce's scaled rates, one worker) run first and set the horizon
                    pilot = m == "single" or (m == "allreduce" and parse(r.config)[0] == "L")
                    want(r, (MAX_EPOCHS if p > 1 else 8) if pilot and cap is None else cap,
                         "the pilots' samples to target at this p")
                for r in self.time_runs(m, p, grid):
                    want(r, 1, "")
            choice.update({(m, p, n): self.chosen(m, p, n) for m in methods for n in NETWORKS})
            for n in NETWORKS:
                for m in methods:
                    c = choice[m, p, n]
                    if c is None:
                        waiting.append(f"sweep {m} p{p} {n}: tuning")
                        self.open_cells |= {(p, n, cond) for cond in CONDITIONS}
                        continue
                    conds = (TUNE_CONDITION,) if m in SYNC else CONDITIONS
                    for cond in conds:
                        for s in SEEDS:
                            run = Run("sweep", m, p, c, s, n, cond)
                            want(run, self.sweep_epochs(m, p, c, n, cond), "the synchronous runs of its cell")
                for cond in CONDITIONS:
                    for m in self.close_methods(p, n, cond):
                        c = choice[m, p, n]
                        for s in MORE_SEEDS:
                            run = Run("sweep", m, p, c, s, n, cond if m not in SYNC else TUNE_CONDITION)
                            want(run, self.sweep_epochs(m, p, c, n, cond), "the synchronous runs of its cell")
                if P1_P in WORKERS and p in (1, P1_P):    # P1's two sides, with their cells
                    m = "single" if p == 1 else "asgd"
                    c = choice[m, p, n]
                    for s in MORE_SEEDS:
                        if c is None:
                            waiting.append(f"P1's seed {s} of {m} at p = {p}: its choice")
                        else:
                            want(Run("sweep", m, p, c, s, n, TUNE_CONDITION),
                                 self.sweep_epochs(m, p, c, n, TUNE_CONDITION),
                                 "the synchronous runs of its cell")
        # last: the authors' forms and P3's n_sync runs (the verdicts' own rows); the authors' rows
        # get MORE_SEEDS by the cells' rule (within CLOSE of the fastest of theirs), and P1's
        # authors' A-SGD at p = 8 always (its other sides came with their cells, above)
        for p in WORKERS:
            more = {cond: self.authors_close(p, cond) for cond in AUTHORS_CONDITIONS}
            for name, (m, c) in AUTHORS.items():
                for cond in ((TUNE_CONDITION,) if m in SYNC else AUTHORS_CONDITIONS):
                    close = (name == "asgd-authors" and p == P1_P
                             or any(name in more[k] for k in (AUTHORS_CONDITIONS if m in SYNC else (cond,))))
                    for s in (*SEEDS, *MORE_SEEDS) if close else SEEDS:
                        run = Run("authors", name, p, c, s, AUTHORS_NETWORK, cond)
                        want(run, self.authors_epochs(name, p, cond),
                             "the tuned synchronous runs of its cell")
        for c, n in NSYNC.items():
            for s in NSYNC_SEEDS:
                want(Run("extra", "asgd", NSYNC_P, f"W{0.05 * NSYNC_P:g}-a{n}", s, TUNE_NETWORK,
                         TUNE_CONDITION), NSYNC_EPOCHS, "")
        seen, out = set(), []
        for r in ready:                       # (a synchronous run serves every network)
            if r.key not in seen:
                seen.add(r.key)
                out.append(r)
        return out, list(dict.fromkeys(waiting))


# ---------------------------------------------------------------------------------------- running
def tree(sha: str) -> Path:
    """A worktree of the pinned commit (made once): every run executes its code and job file."""
    wt = ROOT / "runs" / f"pinned-{sha[:12]}"
    if not (wt / "src" / "scalesgd").is_dir():
        wt.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(wt), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return wt


def data_dirs(data: Path) -> dict[str, Path]:
    """The glyph data sets (built once): main (train + val), tune (train + tune), timing."""
    import glyphs  # noqa: PLC0415  (a sibling: benchmarks/ is sys.path[0])
    if not (data / "main" / "manifest.json").exists():
        glyphs.build(data, 51_200, 5_000, 5_000)
    timing = data.parent / f"{data.name}-timing"
    if not (timing / "main" / "manifest.json").exists():
        glyphs.build(timing, TIMING_TRAIN, 1_000, 1_000)
    return {"sweep": data / "main", "authors": data / "main", "extra": data / "main", "tune": data / "tune",
            "time": timing / "main"}


def execute(run: Run, sha: str, wt: Path, dirs: dict[str, Path], scratch: Path) -> dict:
    """One virtual run from the pinned tree; re-timed under every (network, condition) if its
    arithmetic ignores the clock; writes and returns its record."""
    run_dir = scratch / run.key
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "scalesgd.virtual", "--config", str(wt / "jobs" / "glyphs.toml"),
            "--data", str(dirs[run.kind]), *flags(run.method, run.config, run.workers),
            "--seed", str(run.seed), "--workers", str(run.workers), "--epochs", str(run.epochs),
            "--eval-every", str(EVAL_EVERY), "--profile", run.network, "--condition", run.condition,
            "--threads", "1", "--run-dir", str(run_dir)]
    # (P3's runs go their whole horizon: its exchanges, its final error)
    if run.kind not in ("time", "extra"):
        argv += ["--stop-at-error", str(TARGET)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(wt / "src"))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=wt, capture_output=True, text=True, env=env)
    diverged = proc.returncode != 0 and "the training loss became" in proc.stderr
    if proc.returncode and not diverged:
        raise RuntimeError(f"{run.key}: {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    shown = [a.replace(str(wt) + "/", "").replace(str(ROOT) + "/", "") for a in argv[2:]]
    rec = summarize(run, run_dir, shown, diverged, proc.stderr.strip().splitlines()[-1:] if diverged else [])
    if is_sync(run.method) and run.kind != "time" and not diverged:
        rec["retimed"] = retime(run_dir, wt, env)
    rec.update(commit=sha, real_seconds=time.perf_counter() - t0)
    run.record.parent.mkdir(parents=True, exist_ok=True)
    tmp = run.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(run.record)
    shutil.rmtree(run_dir, ignore_errors=True)
    return rec


def retime(run_dir: Path, wt: Path, env: dict) -> dict[str, list[float]]:
    """The validations' training seconds under every (network, condition) (exact re-timing)."""
    out = {}
    for n in NETWORKS:
        for cond in CONDITIONS:
            dst = run_dir.parent / f"{run_dir.name}-rt"
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "scalesgd.virtual", "retime", str(run_dir), "--profile", n,
                            "--condition", cond, "--run-dir", str(dst)], cwd=wt, env=env, check=True,
                           capture_output=True)
            out[f"{n}/{cond}"] = [v["train_seconds"] for v in vals(dst)]
            shutil.rmtree(dst, ignore_errors=True)
    return out


def vals(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if '"kind": "val"' in x]


def summarize(run: Run, run_dir: Path, argv: list[str], diverged: bool, why: list[str]) -> dict:
    """The committed record: the validation curve (samples, seconds, error, the method's own
    statistics), samples and seconds to target, seconds per sample, worker-steps."""
    extra = ("consensus_distance", "staleness_mean", "staleness_max", "worker_distance", "server_version")
    curve = [dict(samples=v["global_samples"], seconds=v["train_seconds"],
                  error=1.0 - v["val_top1_accuracy"], **{k: v[k] for k in extra if k in v})
             for v in vals(run_dir)]
    s = load(run_dir / "summary.json") or {}
    virt = s.get("virtual", {})
    samples = s.get("samples", curve[-1]["samples"] if curve else 0)
    secs = s.get("train_seconds", curve[-1]["seconds"] if curve else 0.0)
    return dict(key=run.key, kind=run.kind, method=run.method, workers=run.workers, config=run.config,
                seed=run.seed, network=run.network, condition=run.condition, epochs=run.epochs,
                argv=argv, target_error=TARGET, diverged=diverged, diverged_why=why,
                samples_to_target=interpolate(curve, "samples"),
                seconds_to_target=interpolate(curve, "seconds"),
                final_error=curve[-1]["error"] if curve else 0.9,
                samples=samples, train_seconds=secs, seconds_per_sample=secs / max(samples, 1),
                worker_steps=virt.get("worker_steps"), curve=curve)


def piece(minutes: float, jobs: int, data: Path, scratch: Path) -> int:
    sha = commit()
    wt = tree(sha)
    dirs = data_dirs(data)
    deadline = time.monotonic() + 60 * minutes
    done = 0
    with ThreadPoolExecutor(jobs) as pool:
        running: dict = {}
        while True:
            taken = {r.key for r in running.values()}
            todo = [r for r in Study().plan()[0] if r.key not in taken]
            while todo and len(running) < jobs:
                r = todo.pop(0)
                if time.monotonic() + r.cost * 1.2 > deadline:
                    continue
                running[pool.submit(execute, r, sha, wt, dirs, scratch)] = r
                print(f"[{time.strftime('%H:%M:%S')}] start {r.key} ({r.epochs} epochs)", flush=True)
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                r = running.pop(f)
                rec = f.result()
                done += 1
                print(f"[{time.strftime('%H:%M:%S')}] done  {r.key}: error {rec['final_error']:.3f}, "
                      f"samples to target {rec['samples_to_target']}, {rec['real_seconds']:.0f} s real"
                      + (" (diverged)" if rec["diverged"] else ""), flush=True)
    status()
    return 0


def status() -> int:
    st = Study()
    by: dict[str, list] = {}
    for r in st.recs.values():
        d = by.setdefault(r["kind"], [0, 0.0])
        d[0] += 1
        d[1] += r.get("real_seconds", 0.0)
    for k, (n, real) in sorted(by.items()):
        print(f"{k:6s} {n:5d} runs done, {real / 3600:.2f} machine-hours")
    ready, waiting = st.plan()
    total = sum(d[1] for d in by.values()) / 3600
    print(f"ready now: {len(ready)} runs (about {sum(r.cost for r in ready) / 3600:.1f} machine-hours); "
          f"waiting: {len(waiting)}; total so far {total:.2f} machine-hours")
    print(projection(st, ready, waiting, total))
    return 0


def projection(st: Study, ready: list[Run], waiting: list[str], total: float) -> str:
    """Per p (tuning and reported runs): runs and machine-hours so far, open or complete; then the
    whole study projected.  A p's cost is its samples to target (its horizons are multiples of
    them: measured where its pilots have run, else grown from the last measured p by the last
    doubling's growth) times its real cost per worker-step (the ``time`` runs: the same workload
    at every p; it grows with p) times the machine-hours each complete p spent per sample to
    target per millisecond of a worker-step: the lowest and highest of them give the range.  The
    authors' rows and P3 at the mean cost of a reported run.  A planning figure, not a
    measurement."""
    import re  # noqa: PLC0415
    hours: dict[int, float] = {}
    runs: dict[int, int] = {}
    timing: dict[int, list[float]] = {}           # p -> [real seconds, worker-steps] of its time runs
    sweep = [r["real_seconds"] for r in st.recs.values() if r["kind"] == "sweep"]
    for r in st.recs.values():
        if r["kind"] in ("tune", "time", "sweep"):
            hours[r["workers"]] = hours.get(r["workers"], 0.0) + r["real_seconds"] / 3600
            runs[r["workers"]] = runs.get(r["workers"], 0) + 1
        if r["kind"] == "time" and r.get("worker_steps"):
            tm = timing.setdefault(r["workers"], [0.0, 0.0])
            tm[0] += r["real_seconds"]
            tm[1] += r["worker_steps"]
    open_p = {r.workers for r in ready if r.kind in ("tune", "time", "sweep")}
    open_p |= {int(m.group(1)) for w in waiting if not w.startswith("authors")
               for m in [re.search(r"(?:-| )p(\d+)[- ]", w)] if m}
    # a reopened p (complete once, its cells all swept, then given more to do: a wider search, more
    # seeds) counts as measured: its own cost stands for the basis, and its runs ready now are its
    # part of what is left (a lower bound: a choice the new runs change asks for new sweeps)
    sweeps = collections.Counter((r["workers"], r["method"], *(() if r["method"] in SYNC else
                                                                (r["network"], r["condition"])))
                                 for r in st.recs.values() if r["kind"] == "sweep")
    swept = {p for p in (1, *WORKERS) if all(sweeps[(p, m) if m in SYNC else (p, m, n, c)] >= len(SEEDS)
                                             for m in (METHODS if p > 1 else ("single",))
                                             for n in NETWORKS for c in CONDITIONS)}
    reopened = {p: h for p in swept & open_p
                for h in [sum(r.cost for r in ready if r.workers == p and r.kind != "authors") / 3600] if h}
    done_p = [p for p in (1, *WORKERS) if p in hours and (p not in open_p or p in reopened) and p > 1]
    mean_p = sum(hours[p] for p in done_p) / len(done_p) if done_p else None
    lines = [f"p = {p:3d}: {runs.get(p, 0):4d} runs, {hours.get(p, 0.0):5.2f} machine-hours, "
             + (f"reopened (at least {reopened[p]:.2f} machine-hours ready now)" if p in reopened else
                'open' if p in open_p or p not in hours else 'complete') for p in (1, *WORKERS)]
    if mean_p is None or not sweep:
        return "\n".join(lines)
    todo = [p for p in WORKERS if (p in open_p or p not in hours) and p not in reopened]
    best = {p: st.best_samples(p) for p in WORKERS}
    measured = [p for p in WORKERS if p in timing]

    def source(p: int) -> int | None:
        """The p whose time runs stand for p's: p itself, else the nearest measured below (above)."""
        return max((q for q in measured if q <= p), default=min(measured, default=None))

    def ms(p: int) -> float | None:
        """Real milliseconds per worker-step at p (``source(p)``'s time runs)."""
        q = source(p)
        return None if q is None else 1e3 * timing[q][0] / timing[q][1]
    per = {p: hours[p] / best[p] for p in done_p if best[p] and ms(p)}
    if not per:
        return "\n".join(lines)
    unit = {p: per[p] / ms(p) for p in per}                 # machine-hours per sample per ms
    u_lo, u_hi = min(unit.values()), max(unit.values())
    k_mean, k_top = sum(per.values()) / len(per), max(per.values())
    top = max(per, key=per.get)
    known = [p for p in WORKERS if best[p]]
    grow = ((best[known[-1]] / best[known[-2]]) ** (1 / math.log2(known[-1] / known[-2]))   # per doubling
            if len(known) >= 2 else 1.0)
    need = {p: best[p] or best[known[-1]] * grow ** math.log2(p / known[-1]) for p in todo}
    again = sum(reopened.values())
    left = again + sum(max(0.0, u_lo * ms(p) * need[p] - hours.get(p, 0.0)) for p in todo)
    left_hi = again + sum(max(0.0, u_hi * ms(p) * need[p] - hours.get(p, 0.0)) for p in todo)
    kinds = [r["kind"] for r in st.recs.values()]
    authors_left = (max(0, len(AUTHORS) * len(WORKERS) * len(SEEDS) * 2 - kinds.count("authors"))
                    + sum(r.kind == "authors" and r.seed in MORE_SEEDS for r in ready))   # (extra seeds)
    own_h = authors_left * sum(sweep) / len(sweep) / 3600
    if "extra" not in kinds:                 # P3's runs: their whole horizon, at the planning cost
        p3 = Run("extra", "asgd", NSYNC_P, "", 0, "", "", NSYNC_EPOCHS)
        own_h += len(NSYNC) * len(NSYNC_SEEDS) * p3.cost / 3600
    said = ", ".join(f"p = {p}: {need[p] / 1e3:.0f}k{'' if best[p] else ' (grown)'} at {ms(p):.2f} ms"
                     + ("" if p in timing else f" (p = {source(p)}'s)")
                     for p in todo)
    growth = (f"x{grow:.2f} a doubling past p = {known[-1]}" if len(known) >= 2 else
              "as at the last measured p: one p measured, no growth to go by, so larger p will cost more")
    grown = any(not best[p] for p in todo)
    need_said = (f"the open p need {said} (samples to target{f', {growth}' if grown else ''}; real cost of a "
                 "worker-step); " if todo else "")
    steps = f"{', '.join(f'{ms(p):.2f}' for p in per)} ms at p = {', '.join(map(str, per))}"
    again_said = (f"the reopened p at least {again:.1f} (their runs ready now; the sweeps of a choice they "
                  "change follow); " if reopened else "")
    lines.append(f"projection: a p swept in full has cost {mean_p:.2f} machine-hours on average "
                 f"({len(done_p)} of them), {k_mean * 1e5:.2f} per 100k samples to target (the costliest "
                 f"{k_top * 1e5:.2f}, p = {top}), a worker-step costing {steps}; {need_said}{again_said}the "
                 f"authors' rows and P3 about {own_h:.1f}: the study about "
                 f"{total + left + own_h:.1f}–{total + left_hi + own_h:.1f} machine-hours in all")
    return "\n".join(lines)


def pin(sha: str) -> int:
    full = subprocess.run(["git", "rev-parse", sha], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    if PIN.exists() and json.loads(PIN.read_text())["commit"] != full and any(RESULTS.glob("*/*.json")):
        sys.exit(f"crossover: records of {json.loads(PIN.read_text())['commit'][:12]} exist; "
                 "a study runs from one commit (move them away to start another)")
    PIN.parent.mkdir(parents=True, exist_ok=True)
    PIN.write_text(json.dumps({"commit": full}) + "\n")
    print(f"pinned {full}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("run", "status", "pin"))
    ap.add_argument("commit", nargs="?", default="HEAD", help="pin: the commit (default HEAD)")
    ap.add_argument("--minutes", type=float, default=55.0, help="a piece's wall-time budget")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one core each)")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "glyphs")
    ap.add_argument("--scratch", type=Path, default=ROOT / "runs" / "crossover")
    a = ap.parse_args(argv)
    if a.what == "pin":
        return pin(a.commit)
    if a.what == "run":
        return piece(a.minutes, a.jobs, a.data, a.scratch)
    return status()


if __name__ == "__main__":
    sys.exit(main())
