"""The crossover study's design and its plan: which method reaches a target error first, by p,
network and variability, every method at its best after the same search.  ``Study`` reads the
records (``store``) and says what can run next; ``driver`` runs it; ``report`` and ``claims`` judge
it.  The command line: ``python benchmarks/crossover_study.py`` (pin, run, status, report, pack).

**Task.** The procedural glyphs (``benchmarks/glyphs.py``: 51,200 training images, 10 classes,
16x16), ``jobs/glyphs.toml`` (ResNet-8 at half width, batch 8 per worker), a constant rate after an
optional warm-up, target: ``TARGET`` top-1 error.  Every run is a virtual-cluster run (the real
method code, simulated time) from the pinned commit (``pin.json``; a git worktree of it under
``runs/``), ends at its first validation at or below the target (``--stop-at-error``) or at its
horizon, and leaves a JSON record under ``results/crossover/`` with that commit (``store``).

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
the error it reached, as *stopped at the cap*, not as a miss: ``stopped``).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import store

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "crossover"
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
FAMILY = {"allreduce": "sync", "localsgd": "sync", **{m: "async" for m in ASYNC}}   # the two sides
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
    return store.pinned(RESULTS)


def commit() -> str:
    return pinned() or sys.exit("crossover: no pinned commit yet: "
                                "python benchmarks/crossover_study.py pin [COMMIT]")


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
    def cost(self) -> float:
        n = TIMING_TRAIN if self.kind == "time" else 51_200
        return max(self.epochs, 1) * n / 8 * STEP_COST_S


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


def end_seconds(rec: dict, network: str, condition: str) -> float | None:
    """A record's clock at its last validation under (network, condition), as ``seconds_to``
    reads it: a run that did not reach the target would have needed more than that."""
    if is_sync(rec["method"]):
        times = rec.get("retimed", {}).get(f"{network}/{condition}")
        return float(times[-1]) if times else None
    return float(rec["curve"][-1]["seconds"]) if rec["curve"] else None


def stopped(rec: dict, seconds: float | None) -> str:
    """Why a reported run (a sweep or an authors' row) ended, given its time to target in its cell
    (None: not reached): "target"; "diverged"; "cap", an asynchronous run whose horizon was set by
    ``CAP_TIME`` x the best synchronous time of its cell (``sweep_epochs``, ``authors_epochs``) and
    came before ``MAX_EPOCHS``: stopped there to save time, since it could not be the fastest, not a
    missed target; else "horizon", a run that went its whole horizon and missed."""
    if seconds is not None:
        return "target"
    if rec.get("diverged"):
        return "diverged"
    if rec["kind"] in ("sweep", "authors") and not is_sync(rec["method"]) and rec["epochs"] < MAX_EPOCHS:
        return "cap"
    return "horizon"


def stops(row: dict) -> str | None:
    """Why a row of a cell (or an authors' row) did not reach the target in every seed: "cap" when
    each seed that did not was stopped at the cap (its seeds' ``stopped``), else "missed" (a row
    without ``stopped``, of an older analysis, reads as before: missed); None when no seed missed."""
    why = [v.get("stopped") for v in row["seeds"].values() if v["seconds"] is None]
    if not why:
        return None
    return "cap" if all(w == "cap" for w in why) else "missed"


# ---------------------------------------------------------------------------------------- the plan
class Study:
    """What has been done (the records) and what can run next."""

    def __init__(self):
        """Loads the records; one of another commit than the pinned one (``foreign``) is left out,
        as if it had not run."""
        self.recs: dict[str, dict] = {}
        self.foreign: list[str] = []
        pin = pinned()
        for key, r in store.records(RESULTS).items():
            if pin is not None and r.get("commit") != pin:
                self.foreign.append(key)
            else:
                self.recs[key] = r
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
