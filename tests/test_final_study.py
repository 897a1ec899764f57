"""``benchmarks/final_study.py``: the plateau rule that sets the budget E, and the pilot's search and
choice by time to final quality, on records made by hand (the runs themselves are virtual-cluster
runs like the crossover study's, tested there)."""
import json

import pytest

import final_study as F


def rec(error: float, seconds: float = 100.0, curve=None) -> dict:
    curve = curve or [dict(samples=1, seconds=seconds / 2, error=0.5),
                      dict(samples=2, seconds=seconds, error=error)]
    return dict(final_error=curve[-1]["error"], curve=curve, real_seconds=1.0, epochs=1)


def epochs_recs(errors: dict) -> dict:
    """{(method, E): mean final error} -> records for every seed (seed 100 +0.002, 101 -0.002)."""
    out = {}
    for (m, e), err in errors.items():
        for s, d in zip(F.SEEDS, (0.002, -0.002)):
            out[F.key(m, e, s)] = rec(err + d)
    return out


def test_the_plateau_is_the_first_budget_whose_doubling_buys_under_half_the_tolerance():
    recs = epochs_recs({("single", 4): 0.23, ("single", 8): 0.17, ("single", 16): 0.166,
                        ("allreduce", 4): 0.24, ("allreduce", 8): 0.18})
    st = F.plateau(recs)
    assert st["methods"]["single"]["plateau"] == 8            # 8 -> 16 gained 0.4 points <= 0.5
    assert st["methods"]["allreduce"]["plateau"] is None and st["methods"]["allreduce"]["todo"] == [16]
    assert st["E"] is None
    # only the next budget of the undecided method is ready, every seed of it, after the pilot's runs
    todo = F.plan(recs)
    assert [r for r in todo if r[0] == "epochs"] == [("epochs", "allreduce", 16, s) for s in F.SEEDS]
    assert todo[-len(F.SEEDS):] == [("epochs", "allreduce", 16, s) for s in F.SEEDS]
    recs.update(epochs_recs({("allreduce", 16): 0.17}))       # 8 -> 16 gained a point: go on
    assert F.plateau(recs)["methods"]["allreduce"]["todo"] == [32]
    recs.update(epochs_recs({("allreduce", 32): 0.168}))
    st = F.plateau(recs)
    assert st["methods"]["allreduce"]["plateau"] == 16 and st["E"] == 16     # the larger of the two
    # a seed missing: not decided, and that seed is the run ready
    del recs[F.key("allreduce", 32, F.SEEDS[1])]
    assert F.plateau(recs)["E"] is None
    assert ("epochs", "allreduce", 32, F.SEEDS[1]) in F.plan(recs)


def test_the_fit_finds_the_asymptote_and_where_the_rule_would_stop():
    a, b, c = 0.10, 0.5, 0.7
    errs = {e: a + b * e ** -c for e in (4, 8, 16, 32)}
    ft = F.fit(errs)
    assert ft["asymptote"] == pytest.approx(a, abs=2e-3) and ft["c"] == pytest.approx(c, abs=0.02)
    assert not ft["edge"]
    # errors that fall as fast as 1/E toward 0 and past it: the asymptote held at 0, not negative
    held = F.fit({e: 0.8 / e - 0.01 for e in (4, 8, 16, 32)})
    assert held["asymptote"] == 0.0 and held["b"] > 0
    # the first budget 4 * 2^k whose doubling gains <= DELTA / 2, from the true curve
    at = 4
    while b * at ** -c * (1 - 2 ** -c) > F.DELTA / 2:
        at *= 2
    assert ft["plateau"] == at and ft["rms"] < 1e-3
    assert F.fit({4: 0.2, 8: 0.15, 16: 0.13}) is None


def test_time_to_quality_is_interpolated_between_validations():
    curve = [dict(samples=1, seconds=10.0, error=0.5), dict(samples=2, seconds=20.0, error=0.3),
             dict(samples=3, seconds=30.0, error=0.2)]
    assert F.interpolate(curve, 0.4) == pytest.approx(15.0)
    assert F.interpolate(curve, 0.5) == pytest.approx(10.0)
    assert F.interpolate(curve, 0.25) == pytest.approx(25.0)
    assert F.interpolate(curve, 0.1) is None


def test_the_pilot_tunes_all_reduce_by_final_error_then_push_sum_by_time_to_its_quality():
    E = F.BUDGET
    ar, ps = F.PILOT["methods"]["allreduce"][1], F.PILOT["methods"]["pushsum-ov"][1]
    recs = epochs_recs({("single", 4): 0.23, ("single", 8): 0.19, ("single", 16): 0.17,
                        ("single", 32): 0.168, ("allreduce", 4): 0.24, ("allreduce", 8): 0.2,
                        ("allreduce", 16): 0.18, ("allreduce", 32): 0.178})
    todo = F.plan(recs)
    base = [float(f"{ar * f:.4g}") for f in (0.5, 1, 2)]
    assert [r for r in todo if r[1] == "allreduce"] == [("pilot", "allreduce", r, E, s)
                                                         for r in base for s in F.SEEDS]
    # push-sum's first grid runs beside all-reduce's, its choice waits for F*
    assert {r[2] for r in todo if r[1] == "pushsum-ov"} == {float(f"{ps * f:.4g}") for f in (0.5, 1, 2)}
    assert F.fstar(recs, E) is None
    # all-reduce: the middle rate best (its final error 0.15): the search is over, F* = 0.15
    for r, err in zip(base, (0.17, 0.15, 0.16)):
        for s in F.SEEDS:
            recs[F.pilot_key("allreduce", r, E, s)] = rec(err, 200.0)
    assert F.pilot_grid(recs, "allreduce", E) == (base, True)
    assert F.fstar(recs, E) == pytest.approx(0.15)
    # push-sum: the highest rate reaches F* + 1 point soonest: on an edge, one more rate past it
    pbase = [float(f"{ps * f:.4g}") for f in (0.5, 1, 2)]
    for r, (err, secs) in zip(pbase, ((0.20, 100.0), (0.158, 120.0), (0.155, 90.0))):
        for s in F.SEEDS:
            recs[F.pilot_key("pushsum-ov", r, E, s)] = rec(err, secs)
    rates, over = F.pilot_grid(recs, "pushsum-ov", E)
    assert rates == [*pbase, float(f"{pbase[-1] * 2:.4g}")] and not over
    # ready: push-sum's rate past the edge first (every search at E before a check), then
    # all-reduce's choice at CHECK and at SHORT (its search is over)
    assert [r[1:4] for r in F.plan(recs) if r[0] == "pilot"] == [("pushsum-ov", rates[-1], E)] * len(
        F.SEEDS) + [("allreduce", base[1], F.CHECK)] * len(F.SEEDS) + [("allreduce", base[1], F.SHORT)] * len(
        F.SEEDS)
    # ... which misses the quality: the choice stays, the search is over
    for s in F.SEEDS:
        recs[F.pilot_key("pushsum-ov", rates[-1], E, s)] = rec(0.30, 50.0)
    rates, over = F.pilot_grid(recs, "pushsum-ov", E)
    assert over and len(rates) == 4
    table = F.pilot_table(recs, E, {"pushsum-ov": rates}, quality=F.fstar(recs, E))
    assert table["pushsum-ov"]["chosen"] == pbase[-1]
    row = table["pushsum-ov"]["rates"][pbase[-1]]
    assert row["to_quality"] == [pytest.approx(45.0 + 45.0 * (0.5 - 0.16) / (0.5 - 0.155))] * 2
    assert table["pushsum-ov"]["rates"][rates[-1]]["to_quality"] == [None, None]
    # both searches over: each choice runs again at CHECK, then at SHORT, every seed, before the
    # plateau's runs
    assert F.chosen(recs, "allreduce", E) == base[1] and F.chosen(recs, "pushsum-ov", E) == pbase[-1]
    todo = F.plan(recs)
    assert todo[:4 * len(F.SEEDS)] == [("pilot", m, c, e, s) for e in (F.CHECK, F.SHORT)
                                       for m, c in (("allreduce", base[1]), ("pushsum-ov", pbase[-1]))
                                       for s in F.SEEDS]
    ck = F.check(recs)
    assert ck["budget"]["faster"] == "pushsum-ov" and ck["check"] is None and ck["holds"] is None
    assert ck["budget"]["time_ratio"] == pytest.approx(row["to_quality"][0] / (100 + 100 * 0.34 / 0.35))
    assert ck["budget"]["error_gap"] == pytest.approx(0.005)
    # at CHECK all-reduce ends at 0.12 in 400 s; push-sum at 0.135 in 300 s misses 0.13: the verdict
    # (push-sum first) does not hold; at SHORT all-reduce ends at 0.17 in 100 s, push-sum at 0.175 in
    # 60 s reaches 0.18 first: the verdict holds there; then the next runs are the plateau's
    for s in F.SEEDS:
        recs[F.pilot_key("allreduce", base[1], F.CHECK, s)] = rec(0.12, 400.0)
        recs[F.pilot_key("pushsum-ov", pbase[-1], F.CHECK, s)] = rec(0.135, 300.0)
    ck = F.check(recs)
    assert ck["check"]["fstar"] == pytest.approx(0.12) and ck["check"]["faster"] == "allreduce"
    assert ck["check"]["time_ratio"] is None and ck["holds"] is False and ck["holds_short"] is None
    assert {r[3] for r in F.plan(recs) if r[0] == "pilot"} == {F.SHORT}
    for s in F.SEEDS:
        recs[F.pilot_key("allreduce", base[1], F.SHORT, s)] = rec(0.17, 100.0)
        recs[F.pilot_key("pushsum-ov", pbase[-1], F.SHORT, s)] = rec(0.175, 60.0)
    ck = F.check(recs)
    assert ck["short"]["faster"] == "pushsum-ov" and ck["holds_short"] is True and ck["holds"] is False
    assert all(r[0] == "epochs" for r in F.plan(recs))


def test_the_projection_counts_the_issues_design_at_each_budget():
    """Tuning 6 methods x 5 p x 3 rates x 2 seeds; reported seeds 5 at p <= 32 and 3 above: the
    synchronous two's once (re-timed), the asynchronous four's under 5 networks x 3 conditions."""
    n = F.design_runs()
    assert n == dict(tune=180, sync=2 * (3 * 5 + 2 * 3), async_=4 * 15 * (3 * 5 + 2 * 3))
    # the cut: tuning 2 synchronous methods at 3 p, push-sum on 3 networks at 3 p and 2 at 2 p, 3
    # rates x 2 seeds; 3 more reported seeds each, and push-sum's 5 under stragglers
    assert F.cut_runs() == dict(tune=(2 * 3 + 13) * 6, sync=2 * 3 * 3, async_=13 * (3 + 5))
    assert F.epoch_cost(16) == 16 * 6400 * F.STEP_COST_S


def test_the_report_shows_the_fit_the_pilot_and_whether_its_verdict_holds(monkeypatch):
    """summary() over records, then report.py's table of it (docs/results.md, section 14)."""
    import report
    E, C = F.BUDGET, F.CHECK
    ar, ps = F.PILOT["methods"]["allreduce"][1], F.PILOT["methods"]["pushsum-ov"][1]
    recs = epochs_recs({(m, e): err for m in F.METHODS
                        for e, err in ((4, 0.23), (8, 0.18), (16, 0.155), (32, 0.14))})
    for r, err in zip([float(f"{ar * f:.4g}") for f in (0.5, 1, 2)], (0.17, 0.15, 0.16)):
        for s in F.SEEDS:
            recs[F.pilot_key("allreduce", r, E, s)] = rec(err, 200.0)
            recs[F.pilot_key("allreduce", r, C, s)] = rec(err - 0.02, 400.0)
            recs[F.pilot_key("allreduce", r, F.SHORT, s)] = rec(err + 0.03, 100.0)
    for r in [float(f"{ps * f:.4g}") for f in (0.5, 1, 2)]:
        for s in F.SEEDS:
            recs[F.pilot_key("pushsum-ov", r, E, s)] = rec(0.20 if r == ps else 0.22, 150.0)
            recs[F.pilot_key("pushsum-ov", r, C, s)] = rec(0.18, 300.0)
            recs[F.pilot_key("pushsum-ov", r, F.SHORT, s)] = rec(0.24, 75.0)
    monkeypatch.setattr(F, "records", lambda: recs)
    monkeypatch.setattr(F, "pinned", lambda: "0123456789abcdef")
    d = F.summary()
    assert d["E"] == E and d["fit"]["single"]["plateau"] >= 32
    ck = d["pilot"]["check"]
    assert ck["rates"] == {"allreduce": float(f"{ar:.4g}"), "pushsum-ov": ps}
    # push-sum misses F* + 1 point (0.16) at E and at the check: all-reduce first at both
    assert ck["budget"]["faster"] == ck["check"]["faster"] == "allreduce" and ck["holds"] is True
    assert ck["short"]["faster"] == "allreduce" and ck["holds_short"] is True
    assert ck["check"]["fstar"] == pytest.approx(0.13) and ck["budget"]["error_gap"] == pytest.approx(0.05)
    text = report.final_study(json.loads(json.dumps(d)))
    assert "| single | 1 | 23.00% (23.20, 22.80) |" in text and "E = 16, checked at 32 and 8" in text
    assert f"| {C} | 13.00% | pushsum-ov | L{ps:g} | 18.00% | — |" in text
    assert f"The verdict at E = {E} holds at E = {C}." in text
    assert f"The verdict at E = {E} holds at E = {F.SHORT}." in text
    # push-sum ends at 0.20 in 150 s; all-reduce's mean curve gets to 0.20 at 185.7 s: push-sum
    # 1.24x faster, 5 points worse at the end
    t_ar = 100 + 100 * (0.5 - 0.20) / (0.5 - 0.15)
    assert ck["budget"]["allreduce_to_pushsum_error"] == pytest.approx(t_ar)
    assert ck["budget"]["end_ratio"] == pytest.approx(150 / t_ar)
    assert (f"At E = {E} push-sum misses the quality; its whole schedule takes {150 / t_ar:.2f}x the time "
            f"all-reduce takes to push-sum's final error ({t_ar / 150:.2f}x faster), and it ends +5.00 "
            "points") in text
    # the fit's spread over the seeds' resamples: every budget's seeds 0.004 apart
    fr = d["fit_range"]["single"]
    assert fr["resamples"] == 4 ** 4
    assert fr["asymptote"][0] <= d["fit"]["single"]["asymptote"] <= fr["asymptote"][1]
    assert "seed resamples:" in text
