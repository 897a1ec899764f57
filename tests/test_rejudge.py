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
                 p3_ok=None, horizon_miss=False):
        self.best, self.one, self.many, self.slower, self.miss_above = best, one, many, slower, miss_above
        self.p3_ok = p3_ok or {1: 0.2, 10: 0.1, 100: 0.05}
        self.horizon_miss = horizon_miss
        self.recs = {}

    def run(self, r):
        kind, claim, p, config, seed, network, condition = r
        rule, rate, kn = X.parse(config)
        rec = dict(key=R.key(*r), claim=claim, worker_steps=R.P3_EPOCHS * 6400, real_seconds=1.0)
        if claim == "single":
            curve = [dict(samples=i, seconds=i * self.one / 4, error=0.9 - 0.15 * i) for i in range(1, 5)]
            nets, conds = (*R.P1_NETWORKS, R.AUTHORS[0]), (R.P1_CONDITION, R.AUTHORS[1])
            rec.update(curve=curve, final_error=curve[-1]["error"],
                       retimed={f"{n}/{c}": [v["seconds"] for v in curve] for n in nets for c in conds})
        elif claim.startswith("p3"):
            ns = int(claim[3:])
            ok = rate <= self.p3_ok[ns]
            rec.update(samples_to_target=1000.0 / rate if ok else None, seconds_to_target=None,
                       final_error=0.3 if ok else 0.85 + 0.1 * rate)        # too high a rate: worse
        else:
            t = self.many * (1.1 ** abs(math.log2(rate / self.best))) * (self.slower if kn == "a4" else 1.0)
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
    assert "L0.0125-a1" in cfgs and "L0.025-a1" not in cfgs[:7]
    assert se.chosen() == "L0.0125-a1"
    assert sum(1 for c in cfgs if c.endswith("-a1")) <= 3 + R.EDGE_MORE


def test_p1_agrees_or_disagrees_by_the_speedup_interval_and_a_miss_disagrees():
    fast = R.summary(World(one=400.0, many=100.0).finish().recs)
    row = next(r for r in fast["rows"] if r["claim"] == "P1" and r["network"] == "a100-ib100-resnet50")
    # one worker reaches 40% a third of the way from its 3rd validation (45%) to its 4th (30%)
    assert row["verdict"] == "agrees" and row["speedup"] == pytest.approx(400.0 * 5 / 6 / (100 * 1.02))
    assert row["lo"] <= row["speedup"] <= row["hi"]
    slow = R.summary(World(one=200.0, many=100.0).finish().recs)
    row = next(r for r in slow["rows"] if r["claim"] == "P1" and r["network"] == "v100-10gbe-resnet50")
    assert row["verdict"] == "disagrees" and row["hi"] < R.PAINE
    missed = R.summary(World(horizon_miss=True).finish().recs)
    row = next(r for r in missed["rows"] if r["claim"] == "P1" and r["network"] == "a100-ib100-resnet50")
    assert row["verdict"] == "disagrees" and row["missed"] == 1 and "missed the target at their horizon" in \
        row["evidence"]
    assert fast["complete"] and fast["ready"] == 0


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
    assert p3["verdict"] == "agrees" and p3["per"]["100"]["exchanges"] >= 50
    never = R.summary(World(p3_ok={1: 0.2, 10: 0.1, 100: 1e-9}).finish().recs)
    assert next(r for r in never["rows"] if r["claim"] == "P3")["verdict"] == "disagrees"


def test_nothing_is_called_before_its_runs_are_in():
    d = R.summary({})
    assert {r["verdict"] for r in d["rows"]} == {"not run yet"} and not d["complete"]
    first = R.todo({})
    assert {r[1] for r in first} == {"single", "authors", "p1", "p3n1", "p3n10", "p3n100"}
    assert all(r[0] == "rep" for r in first if r[1] in ("single", "authors"))
