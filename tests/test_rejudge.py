"""benchmarks/rejudge.py: P1's and P3's searches, runs and calls over records made up to a known
answer (the runs themselves are virtual-cluster runs, tested in test_virtual*.py)."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rejudge as R  # noqa: E402
from crossover import study as X  # noqa: E402


class World:
    """Made-up runs.  A-SGD at p = 8: seconds to target least at rate ``best`` (n_sync 4 ``a4``
    ``slower`` times as long), 10% more a doubling away, misses past ``miss_above``; one worker
    ``one`` x 5/6 seconds; P3: n_sync n reaches the target only at rate <= ``p3_ok[n]``, and ends
    worse the higher its rate where it does not."""

    def __init__(self, best=0.003125, one=300.0, many=100.0, slower=1.5, miss_above=1.0,
                 p3_ok=None, horizon_miss=False, best_a4=None, diverge=(), p3_chance=()):
        self.best, self.one, self.many, self.slower, self.miss_above = best, one, many, slower, miss_above
        self.p3_ok = p3_ok or {1: 0.2, 10: 0.1, 100: 0.05}
        self.horizon_miss, self.best_a4, self.diverge = horizon_miss, best_a4, diverge
        self.p3_chance = p3_chance          # n_sync whose misses learn nothing (noise: higher rates "better")
        self.recs = {}

    def run(self, r):
        kind, claim, p, config, seed, network, condition = r
        rule, rate, kn = X.parse(config)
        rec = dict(key=R.key(*r), claim=claim, worker_steps=R.P3_EPOCHS * 6400, real_seconds=1.0)
        if claim == "single":
            curve = [dict(samples=i, seconds=i * self.one / 4, error=0.9 - 0.15 * i) for i in range(1, 5)]
            # each (network, condition) its own clock: 1x, 2x, 3x one worker's seconds
            pairs = [f"{n}/{R.P1_CONDITION}" for n in R.P1_NETWORKS] + [f"{R.AUTHORS[0]}/{R.AUTHORS[1]}"]
            rec.update(curve=curve, final_error=curve[-1]["error"],
                       retimed={k: [v["seconds"] * (i + 1) for v in curve] for i, k in enumerate(pairs)})
            if ("single", seed) in self.diverge:
                del rec["retimed"]
                rec["diverged"] = True
        elif claim.startswith("p3"):
            ns = int(claim[3:])
            ok = rate <= self.p3_ok[ns]
            rec.update(samples_to_target=1000.0 / rate if ok else None, seconds_to_target=None,
                       final_error=0.3 if ok else 0.905 - 0.01 * rate if ns in self.p3_chance
                       else 0.85 + 0.1 * rate)                                  # too high a rate: worse
            if ("p3", seed) in self.diverge and kind == "rep":
                rec.update(worker_steps=None, diverged=True, samples_to_target=None, final_error=0.9)
        else:
            best = self.best_a4 if kn == "a4" and self.best_a4 else self.best
            t = self.many * (1.1 ** abs(math.log2(rate / best))) * (self.slower if kn == "a4" else 1.0)
            t *= 1 + 0.01 * seed
            miss = rate > self.miss_above or (self.horizon_miss and kind == "rep" and seed == 3)
            rec.update(seconds_to_target=None if miss else t, samples_to_target=None if miss else t,
                       final_error=0.45 if miss else 0.39)
        self.recs[rec["key"]] = rec

    def finish(self):
        for _ in range(100):
            todo = R.todo(self.recs)
            if not todo:
                return self
            for r in todo:
                self.run(r)
        raise AssertionError("never ends")


def test_p1_searches_each_setting_past_its_edges_and_picks_the_fastest():
    """The grid is the crossover study's choice x 1/2, 1, 2 per n_sync setting; a best on an edge
    adds a rate past it (at most 2); the choice is the fastest over both settings."""
    w = World(best=0.0125).finish()
    se = R.searches(w.recs)["P1/a100-ib100-resnet50"]
    cfgs, over = se.grid()
    assert over and cfgs[:6] == ["L0.001563-a1", "L0.003125-a1", "L0.00625-a1",
                                 "L0.001563-a4", "L0.003125-a4", "L0.00625-a4"]
    # each setting's best sits on its top edge: two more rates each (the most a setting gets)
    assert sorted(cfgs[6:]) == ["L0.0125-a1", "L0.0125-a4", "L0.025-a1", "L0.025-a4"]
    assert se.chosen() == "L0.0125-a1"


def test_each_setting_gets_its_own_edge_steps():
    """n_sync 1 best inside its rates, n_sync 4 on its top edge behind it: n_sync 4 still goes past
    its edge, and wins there (A-SGD at its best, whichever setting that is)."""
    w = World(best=0.003125, best_a4=0.05, slower=0.8).finish()
    se = R.searches(w.recs)["P1/v100-10gbe-resnet50"]
    cfgs, over = se.grid()
    assert over and {c for c in cfgs if c.endswith("-a1")} == {"L0.001563-a1", "L0.003125-a1", "L0.00625-a1"}
    assert {"L0.0125-a4", "L0.025-a4"} <= set(cfgs) and se.chosen() == "L0.025-a4"


def test_p1_agrees_or_disagrees_by_the_speedup_interval_and_a_miss_disagrees():
    fast = R.summary(World(one=400.0, many=100.0).finish().recs)
    row = next(r for r in fast["rows"] if r["claim"] == "P1" and r["network"] == "a100-ib100-resnet50")
    # one worker reaches 40% a third of the way from its 3rd validation (45%) to its 4th (30%)
    assert row["verdict"] == "agrees" and row["speedup"] == pytest.approx(400.0 * 5 / 6 / (100 * 1.02))
    assert row["lo"] <= row["speedup"] <= row["hi"]
    slow = R.summary(World(one=100.0, many=100.0).finish().recs)
    row = next(r for r in slow["rows"] if r["claim"] == "P1" and r["network"] == "v100-10gbe-resnet50")
    assert row["verdict"] == "disagrees" and row["hi"] < R.PAINE
    missed = R.summary(World(horizon_miss=True).finish().recs)
    row = next(r for r in missed["rows"] if r["claim"] == "P1" and r["network"] == "a100-ib100-resnet50")
    assert row["verdict"] == "disagrees" and row["missed"] == 1
    assert "missed the target at their horizon (12 epochs) in 1 of 5 seeds (ending at 45% error)" \
        in row["evidence"]
    assert fast["complete"] and fast["ready"] == 0
    # each side on its own clock: one worker re-timed under the row's network and condition (2x on v100)
    v100 = next(r for r in fast["rows"] if r["claim"] == "P1" and r["network"] == "v100-10gbe-resnet50")
    assert v100["one_seconds"] == pytest.approx(2 * 400.0 * 5 / 6)
    # the authors' form: its own untuned configuration against one worker under titanx / none (3x)
    auth = next(r for r in fast["rows"] if r["claim"] == "P1 (the authors' form)")
    assert auth["config"] == "W0.2-a1" and auth["one_seconds"] == pytest.approx(3 * 400.0 * 5 / 6)
    assert auth["many_seconds"] == pytest.approx(100 * 1.1 ** math.log2(0.2 / 0.003125) * 1.02)


def test_a_diverged_run_is_a_miss_not_a_crash():
    """One worker diverging in a seed: P1 cannot be judged ("not run", said); a diverged P3 seed
    counts as not reaching the target, its exchanges from the seeds that ran."""
    d = R.summary(World(diverge=(("single", 2), ("p3", 1))).finish().recs)
    assert {r["verdict"] for r in d["rows"] if r["claim"].startswith("P1")} == {"not run"}
    p3 = next(r for r in d["rows"] if r["claim"] == "P3")
    assert p3["per"]["100"]["reached"] == 2 and p3["per"]["100"]["diverged"] == 1
    assert p3["per"]["100"]["exchanges"] == 64 and p3["verdict"] == "partly agrees"


def test_p3_tunes_the_rate_per_n_sync_and_agrees_when_n_sync_100_trains():
    """n_sync 100 trains only at a rate below n_sync 1's: the edge rule finds it, and P3 agrees;
    with no rate that trains (past the edge steps) it disagrees."""
    w = World(p3_ok={1: 0.2, 10: 0.1, 100: 0.02}).finish()
    se = R.searches(w.recs)
    assert X.parse(se["P3/n1"].chosen())[1] <= 0.2
    cfgs, over = se["P3/n100"].grid()
    assert over and cfgs == ["W0.2-a100", "W0.1-a100", "W0.05-a100", "W0.025-a100", "W0.0125-a100"]
    assert se["P3/n100"].chosen() == "W0.0125-a100"
    d = R.summary(w.recs)
    p3 = next(r for r in d["rows"] if r["claim"] == "P3")
    assert p3["verdict"] == "agrees"
    assert [p3["per"][n]["exchanges"] for n in ("1", "10", "100")] == [6400, 640, 64]
    never = R.summary(World(p3_ok={1: 0.2, 10: 0.1, 100: 1e-9}).finish().recs)
    assert next(r for r in never["rows"] if r["claim"] == "P3")["verdict"] == "disagrees"


def test_a_setting_that_learns_nothing_at_any_rate_steps_down_not_after_noise():
    """n_sync 100 ends at chance at every starting rate, the highest by a hair the "best": the
    search halves the lowest rate (not doubles the highest), twice, and finds the rate that trains;
    a setting that learns something keeps the edge rule (n_sync 10 here)."""
    w = World(p3_ok={1: 0.2, 10: 0.1, 100: 0.0125}, p3_chance=(100,)).finish()
    se = R.searches(w.recs)
    cfgs, over = se["P3/n100"].grid()
    assert over and cfgs == ["W0.2-a100", "W0.1-a100", "W0.05-a100", "W0.025-a100", "W0.0125-a100"]
    assert se["P3/n100"].chosen() == "W0.0125-a100"
    assert se["P3/n10"].grid() == (["W0.2-a10", "W0.1-a10", "W0.05-a10"], True)
    assert next(r for r in R.summary(w.recs)["rows"] if r["claim"] == "P3")["verdict"] == "agrees"
    # the old rule, after the noise, would have doubled the highest: W0.4, which never trains
    assert "W0.4-a100" not in cfgs


def test_nothing_is_called_before_its_runs_are_in():
    d = R.summary({})
    assert {r["verdict"] for r in d["rows"]} == {"not run yet"} and not d["complete"]
    first = R.todo({})
    assert {r[1] for r in first} == {"single", "authors", "p1", "p3n1", "p3n10", "p3n100"}
    assert all(r[0] == "rep" for r in first if r[1] in ("single", "authors"))
