"""benchmarks/final_map.py: the search's order and rules, the reported runs, the cells and the
family call, over records made up to a known answer (the runs themselves are virtual-cluster runs,
tested in test_virtual*.py)."""
import functools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import final_map as M  # noqa: E402

V = 16                      # validations a run


def curve(final: float, unit: float, shape: float = 0.5) -> list[dict]:
    return [dict(samples=i, seconds=unit * i, error=0.9 - (0.9 - final) * (i / V) ** shape)
            for i in range(1, V + 1)]


class World:
    """Made-up runs: a method's final error is least at its best rate (setting t16m 1 point worse),
    grows 2 points a doubling away from it, 0.2 points more for odd seeds; push-sum's is ``gap``
    above all-reduce's and its step ``speed`` times as long; the networks' steps scale by ``NET``,
    stragglers add 10%."""
    BEST = {"allreduce": 0.1, "localsgd": 0.03, "pushsum-ov": 0.2}
    NET = {"titanx-fdr-resnet18": 3.0, "a100-ib100-resnet50": 1.0, "v100-10gbe-resnet50": 2.0,
           "v100x8-10gbe-resnet50": 2.5, "a100x8-ib100-resnet50": 1.2}

    def __init__(self, gap=0.05, speed=0.5, slope=0.02, worse=0.0, quick=False):
        self.gap, self.speed, self.slope, self.worse, self.quick = gap, speed, slope, worse, quick
        self.recs = {}

    def error(self, m, cfg, seed):
        rate, st = M.parse(cfg)
        return (0.14 + self.slope * abs(math.log2(rate / self.BEST[m])) + (0.01 if st == "t16m" else 0)
                + 0.002 * (seed % 2) + (self.gap if m == "pushsum-ov" else 0.0)
                + (self.worse if m == "localsgd" else 0.0))

    def shape(self, m, cfg):
        """``quick``: a higher rate gets down sooner (its curve's exponent smaller)."""
        return 0.5 * (self.BEST[m] / M.parse(cfg)[0]) ** 0.5 if self.quick else 0.5

    def step(self, m, net, cond):
        return (self.NET[net] * (self.speed if m == "pushsum-ov" else 1.0)
                * (1.1 if cond == "stragglers" else 1))

    def run(self, r):
        kind, m, ag, p, cfg, seed, net, cond = r
        fe = self.error(m, cfg, seed)
        rec = dict(key=M.run_key(*r), method=m, agents=ag, workers=p, config=cfg, seed=seed, network=net,
                   condition=cond, diverged=False, final_error=None, real_seconds=1.0)
        if m in M.SYNC:
            rec["curve"] = curve(fe, 1.0, self.shape(m, cfg))
            rec["retimed"] = {f"{n}/{c}": [x["seconds"] * self.step(m, n, c) for x in rec["curve"]]
                              for n in M.networks_of(ag) for c in M.CONDITIONS}
        else:
            rec["curve"] = curve(fe, self.step(m, net, cond), self.shape(m, cfg))
        rec["final_error"] = rec["curve"][-1]["error"]
        self.recs[rec["key"]] = rec

    def finish(self, limit=2000):
        for _ in range(limit):
            todo = M.Plan(self.recs).todo()
            if not todo:
                return
            for r in todo:
                self.run(r)
        raise AssertionError("the plan never ends")


@functools.lru_cache(maxsize=None)
def finished(gap: float, speed: float, **kw) -> World:
    """A World run to the plan's end (shared: the tests only read it)."""
    w = World(gap, speed, **kw)
    w.finish()
    return w


def test_the_first_runs_are_the_p32_grids_around_the_pilots_rates():
    todo = M.Plan({}).todo()
    assert {r[3] for r in todo} == {32} and {r[0] for r in todo} == {"tune"}
    got = {(r[1], r[2], r[6]): sorted({r[4] for r in todo if r[1:3] == (m, a) and r[6] == n})
           for r in todo for m, a, n in [(r[1], r[2], r[6])]}
    ar = M.START["allreduce"]
    assert got[("allreduce", "flat", None)] == sorted(M.config(float(f"{ar * f:.4g}"), "")
                                                      for f in (0.5, 1, 2))
    assert all(c.endswith("-t4") for c in got[("localsgd", "flat", None)])
    assert {n for (m, _, n) in got if m == "pushsum-ov"} == set(M.FLAT)      # node lines wait for them
    assert len(todo) == (2 + len(M.FLAT)) * 3 * len(M.TUNE_SEEDS)
    assert all(r[7] == M.TUNE_CONDITION for r in todo if r[1] == "pushsum-ov")


def test_push_sums_cells_complete_one_at_a_time_before_its_other_searches_run():
    """At a p whose synchronous lines are done: push-sum's reported runs where its search is over
    come before its tuning elsewhere (the node agents'), a cell's five seeds one after another."""
    w = finished(0.05, 0.5)
    recs = {k: r for k, r in w.recs.items()
            if not (r["workers"] == 32 and r["method"] == "pushsum-ov"
                    and (r["key"].startswith("rep") or r["agents"] == "node"))}
    todo = [r for r in M.Plan(recs).todo() if r[3] == 32]
    assert {r[1] for r in todo} == {"pushsum-ov"}
    kinds = [r[0] for r in todo]
    assert kinds == sorted(kinds, key=lambda k: k == "tune") and "tune" in kinds
    assert {r[2] for r in todo if r[0] == "rep"} == {"flat"}
    assert {r[2] for r in todo if r[0] == "tune"} == {"node"}
    reps = [r for r in todo if r[0] == "rep"]
    assert len(reps) == len(M.FLAT) * len(M.ASYNC_CONDITIONS) * len(M.SEEDS)
    for i in range(0, len(reps), len(M.SEEDS)):
        cell = reps[i:i + len(M.SEEDS)]
        assert len({(r[4], r[6], r[7]) for r in cell}) == 1 and [r[5] for r in cell] == list(M.SEEDS)


def test_the_search_extends_past_edges_per_setting_then_tries_the_other_setting():
    w = finished(0.05, 0.5)
    plan = M.Plan(w.recs)
    for p in M.P:
        s = M.Search(plan, "localsgd", "flat", p, None)
        cfgs, over = s.grid()
        assert over
        t4 = sorted(M.parse(c)[0] for c in cfgs if c.endswith("-t4"))
        t16 = sorted(M.parse(c)[0] for c in cfgs if c.endswith("-t16m"))
        assert t16, "the settings step tried tau 16 with SlowMo"
        assert len(t4) <= 3 + M.EDGE_MORE
        assert s.chosen().endswith("-t4")           # (t16m is a point worse at every rate)
    # the starting rate 0.01768 is under local SGD's best 0.03: the choice sits on the upper edge
    s32 = M.Search(plan, "localsgd", "flat", 32, None)
    assert len([c for c in s32.grid()[0] if c.endswith("-t4")]) == 4
    # each p starts from the p before's choice
    for m in ("allreduce", "localsgd"):
        for hi, lo in zip(M.P, M.P[1:]):
            c = M.Search(plan, m, "flat", hi, None).chosen()
            assert c in M.Search(plan, m, "flat", lo, None).grid()[0]


def test_every_line_ends_with_its_reported_runs_and_node_allreduce_borrows_the_flat_search():
    w = finished(0.05, 0.5)
    plan = M.Plan(w.recs)
    assert not any(k.startswith("tune/allreduce-node") for k in w.recs)
    for p in M.NODE_P:
        flat = M.Search(plan, "allreduce", "flat", p, None)
        node = M.Search(plan, "allreduce", "node", p, None)
        assert node.chosen("v100x8-10gbe-resnet50") == flat.chosen("v100-10gbe-resnet50")
        assert all(f"rep/allreduce-node-p{p}-E{M.E}-{node.chosen(n)}-s{s}" in w.recs
                   for n in M.NODE for s in M.SEEDS)
    # push-sum: every seed under none and stragglers, each network, at its own choice
    for n in M.FLAT:
        c = M.Search(plan, "pushsum-ov", "flat", 8, n).chosen()
        for cond in M.ASYNC_CONDITIONS:
            assert all(M.run_key("rep", "pushsum-ov", "flat", 8, c, s, n, cond) in w.recs for s in M.SEEDS)
        assert not any(k.endswith(f"{n}-typical") for k in w.recs)
    d = M.summary(w.recs)
    assert d["least_left"] == 0
    # before any run: 3 rates x 2 seeds a line (local SGD one more setting), all-reduce as node agents
    # none; 5 reported seeds a synchronous line, 5 under each of 2 conditions a push-sum line
    assert M.summary({})["least_left"] == (3 * (6 + 5) + 3 * (8 + 5) + 2 * (8 + 5) + 2 * 5
                                           + (9 + 4) * (6 + 10))
    assert len(d["cells"]) == len(M.FLAT) * 3 * len(M.P) + len(M.NODE) * 3 * len(M.NODE_P)
    assert d["ready"] == 0 and all(t["over"] for t in d["tuning"].values())


def test_a_pushsum_that_misses_the_quality_loses_and_says_by_how_much():
    w = finished(0.05, 0.5)
    cells = M.cells(w.recs)
    for c in cells:
        if c["condition"] == "typical":
            assert c["call"]["outcome"] == "not run" and "pushsum-ov" not in c["methods"]
            continue
        ps = c["methods"]["pushsum-ov"]
        assert c["call"]["outcome"] == "sync" and ps["to_quality"] is None
        assert ps["error_gap"] == pytest.approx(0.05, abs=0.005)
        assert ps["end_ratio"] is not None and ps["end_ratio"] < 1     # quicker, worse
        assert c["fstar"] == pytest.approx(min(v["final_error"] for m, v in c["methods"].items()
                                               if m in M.SYNC))
        assert c["noise_units"] == pytest.approx(8 * c["p"] / M.B_NOISE)


def test_a_pushsum_as_good_and_twice_as_quick_wins_and_one_no_quicker_does_not():
    w = finished(0.0, 0.5)
    assert {c["call"]["outcome"] for c in M.cells(w.recs) if c["condition"] != "typical"} == {"async"}
    w = finished(0.0, 1.0)
    cells = [c for c in M.cells(w.recs) if c["condition"] != "typical"]
    # all-reduce's step and curve shape: never called first; within 1% of the synchronous pick's time
    # (these made-up seeds have no noise: the call is the sign of that small difference)
    assert all(c["call"]["outcome"] != "async" for c in cells)
    assert all(abs(c["call"]["diff"]) < 0.01 * c["methods"][c["sync_pick"]]["to_quality"] for c in cells)


def test_the_call_resamples_the_seeds_and_redoes_fstar_and_the_picks():
    def arr(finals, unit):
        return np.array([[(unit * i, 0.9 - (0.9 - f) * i / 4) for i in range(1, 5)] for f in finals])
    sync = arr([0.15, 0.16, 0.14, 0.15, 0.15], 1.0)
    # push-sum's seeds spread around the quality (0.16): in some resamples it misses
    noisy = arr([0.12, 0.30, 0.12, 0.30, 0.12], 0.5)
    c = M.call({"allreduce": sync, "pushsum-ov": noisy})
    assert c["outcome"] == "tie" and c["lo"] == "-inf" and c["hi"] > 0 and 0 < c["async_misses"] < 1
    # F* and the synchronous pick made again in each resample: local SGD's seeds 0-1 are good and
    # quick, 2-4 bad; all-reduce is steady and slow.  On seeds {0, 1} local SGD is F* and the pick;
    # on {2, 3, 4} all-reduce is, and F* is all-reduce's 0.15
    rows = {"allreduce": arr([0.15] * 5, 1.0), "localsgd": arr([0.12, 0.12, 0.2, 0.2, 0.2], 0.5),
            "pushsum-ov": arr([0.14] * 5, 0.8)}
    d, a = M.family_diffs(rows, np.array([[0, 1, 0, 1, 0], [2, 3, 4, 2, 3]]))
    # {0, 1}: F* = 0.12, the quality 0.13; push-sum (0.14) misses it: the synchronous family first
    assert np.isinf(a[0]) and d[0] == -np.inf
    # {2, 3, 4}: F* = 0.15, the quality 0.16; all-reduce (the pick: local SGD ends at 0.2) gets
    # there between its 3rd and 4th validations, push-sum sooner on its quicker clock
    t_ar = 1.0 * (3 + (0.3375 - 0.16) / (0.3375 - 0.15))
    t_ps = 0.8 * (3 + (0.33 - 0.16) / (0.33 - 0.14))
    assert a[1] == pytest.approx(t_ps) and d[1] == pytest.approx(t_ar - t_ps)
    # (kept at the observed F* = 0.15 and pick, the first resample would have push-sum reach 0.16)
    good = arr([0.15] * 5, 0.5)
    c = M.call({"allreduce": sync, "localsgd": arr([0.2] * 5, 0.1), "pushsum-ov": good})
    # local SGD is quick but never within a point: all-reduce is the synchronous pick
    assert c["outcome"] == "async" and c["diff"] > 0
    assert M.call({"allreduce": sync})["outcome"] == "not run"
    # first_times interpolates like final_study.interpolate, inf where it never gets there
    m = np.array([[(10.0, 0.5), (20.0, 0.3), (30.0, 0.2)]])
    assert M.first_times(m, np.array([0.4])) == pytest.approx([15.0])
    assert M.first_times(m, np.array([0.5])) == pytest.approx([10.0])
    assert np.isinf(M.first_times(m, np.array([0.1])))[0]


def test_a_diverged_seed_is_carried_at_chance():
    c = [dict(seconds=1.0, error=0.5), dict(seconds=2.0, error=0.3)]
    a = M.padded([c, c[:1]])
    assert a.shape == (2, 2, 2) and a[1, 1].tolist() == [2.0, 0.9]


def test_the_report_shows_the_map_and_every_cell(monkeypatch):
    import json
    import report
    monkeypatch.setattr(M, "pinned", lambda: "0123456789abcdef")
    empty = report.final_map(json.loads(json.dumps(M.summary({}))))
    assert empty.startswith("No cell has all its reported runs yet: 0 runs")
    w = finished(0.05, 0.5)
    text = report.final_map(json.loads(json.dumps(M.summary(w.recs))))
    assert f"| p = 8 ({64 / M.B_NOISE:.2f} B_noise) |" in text
    row = next(x for x in text.splitlines() if x.startswith("| v100-10gbe-resnet50 | none |"))
    assert row.count("**sync**; push-sum misses (+5.0 pts, its end") == 3
    # where push-sum misses in every resample the interval is said in words, not [-inf, -inf]
    assert "| sync (push-sum misses it in every resample) |" in text and "inf" not in text
    assert report.call_interval(dict(lo="-inf", hi=12.5, async_misses=0.25)) == \
        " [−∞, +12.5]; push-sum misses it in 25% of resamples"
    assert report.call_interval(dict(lo=-3.0, hi=-1.0, async_misses=0.0)) == " [-3, -1]"
    # under typical no push-sum runs: the map names the synchronous pick and says why
    first = "localsgd first of the synchronous (no push-sum here)"
    assert f"| a100x8-ib100-resnet50 | typical | — | {first} | {first} |" in text
    assert "| v100x8-10gbe-resnet50 | stragglers | 16 |" in text


def test_a_synchronous_method_that_misses_the_quality_is_reported_and_the_other_picked():
    w = finished(0.0, 0.5, worse=0.03)
    for c in M.cells(w.recs):
        ls = c["methods"]["localsgd"]
        assert ls["to_quality"] is None and c["sync_pick"] == "allreduce"
        assert ls["final_error"] > c["fstar"] + M.DELTA


def test_a_synchronous_choice_by_time_on_an_edge_extends_the_grid():
    """Final error a quarter point worse a doubling, and a higher rate quicker down: all-reduce's
    least final error sits inside its grid, its quickest to quality on the top edge: more rates."""
    w = finished(0.05, 0.5, slope=0.0025, quick=True)
    plan = M.Plan(w.recs)
    s = M.Search(plan, "allreduce", "flat", 32, None)
    first, _, _ = s.first()
    grid, over = s.grid()
    assert over and len(grid) > len(first)
    top = max(M.parse(c)[0] for c in grid)
    assert all(s.chosen(n) != M.config(top, "") or len(grid) == len(first) + M.EDGE_MORE for n in M.FLAT)


def test_a_diverged_synchronous_seed_stays_in_its_cell_at_chance():
    w = World(0.0, 0.5)
    w.finish()
    c0 = next(c for c in M.cells(w.recs) if c["network"] == "a100-ib100-resnet50" and c["p"] == 8
              and c["condition"] == "none")
    key = M.run_key("rep", "allreduce", "flat", 8, c0["methods"]["allreduce"]["config"], 0)
    w.recs[key] = dict(w.recs[key], diverged=True, curve=w.recs[key]["curve"][:3], final_error=0.9)
    del w.recs[key]["retimed"]
    c = next(c for c in M.cells(w.recs) if c["network"] == "a100-ib100-resnet50" and c["p"] == 8
             and c["condition"] == "none")
    ar = c["methods"]["allreduce"]
    assert ar["seeds"][0] == 0.9 and ar["final_error"] > c0["methods"]["allreduce"]["final_error"]
    assert c["sync_pick"] == "localsgd"


def test_configuration_names_parse_back_with_exponents_and_settings():
    for rate, st in ((3.4e-05, ""), (3.4e-05, "t4"), (0.07072, "t16m"), (0.1, "")):
        assert M.parse(M.config(rate, st)) == (rate, st)


def test_a_cell_waits_for_every_method_it_holds():
    w = finished(0.05, 0.5)
    recs = dict(w.recs)
    plan = M.Plan(recs)
    c = M.Search(plan, "pushsum-ov", "flat", 16, "titanx-fdr-resnet18").chosen()
    del recs[M.run_key("rep", "pushsum-ov", "flat", 16, c, 3, "titanx-fdr-resnet18", "stragglers")]
    got = {(c["network"], c["condition"], c["p"]) for c in M.cells(recs)}
    assert ("titanx-fdr-resnet18", "stragglers", 16) not in got
    assert ("titanx-fdr-resnet18", "none", 16) in got and ("titanx-fdr-resnet18", "typical", 16) in got


def test_plan_reads_the_shipped_cells_as_the_map_does(monkeypatch):
    """The study file ``report`` ships (``study_file``) read by ``plan`` (virtual/planfinal.py) on a
    clock equal to the map's: F*, each method's time to the quality and to its end, and a missing
    push-sum's gap and its end against the synchronous pick, all as the map's own cell has them."""
    from scalesgd.virtual import planfinal as PF
    from scalesgd.virtual import profile as PR
    w = finished(0.05, 0.5)
    d = M.summary(w.recs)
    f = M.study_file(d, w.recs)
    net, cond = "v100-10gbe-resnet50", "stragglers"
    cell = next(c for c in d["cells"] if (c["network"], c["condition"], c["p"]) == (net, cond, 32))
    assert f["cells"][f"{net}/{cond}/p32"]["fstar"] == cell["fstar"]

    def clock(study, flags, p, prof, yours, seed, end):        # the World's clock on that network
        m = {"allreduce": "allreduce", "localsgd": "localsgd", "gossip": "pushsum-ov"}[flags.split()[1]]
        return [(i, i * w.step(m, net, cond)) for i in range(1, V + 1)]
    monkeypatch.setattr(PF, "clocks", lambda study, prof, yours, jobs, procs: [
        clock(study, flags, p, prof, yours, seed, end) for flags, p, seed, end in jobs])
    res = PF.predict_final(f, PR.load(net), 32, cond)
    assert res["fstar"] == cell["fstar"] and res["quality"] == cell["fstar"] + M.DELTA
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == set(cell["methods"])
    for m, v in cell["methods"].items():
        assert rows[m]["to_quality"] == pytest.approx(v["to_quality"]) if v["to_quality"] is not None \
            else rows[m]["to_quality"] is None
        assert rows[m]["end"] == pytest.approx(v["end"]) and rows[m]["final_error"] == v["final_error"]
    ps = cell["methods"]["pushsum-ov"]
    assert ps["to_quality"] is None and rows["pushsum-ov"]["vs"]["method"] == cell["sync_pick"]
    assert rows["pushsum-ov"]["gap"] == pytest.approx(ps["error_gap"])
    assert rows["pushsum-ov"]["vs"]["ratio"] == pytest.approx(ps["end_ratio"])
    # under 'typical', which the map ran without push-sum: its statistics are those of 'none', said
    monkeypatch.setattr(PF, "clocks", lambda study, prof, yours, jobs, procs: [
        [(i, float(i)) for i in range(1, V + 1)] for _ in jobs])
    typ = PF.predict_final(f, PR.load(net), 32, "typical")
    assert "pushsum-ov" in {r["method"] for r in typ["rows"]}
    assert any("ran under none and stragglers only: its statistics under typical are those of none" in n
               for n in typ["notes"])
    # a cell with no synchronous result is not shipped
    gone = dict(d, cells=[dict(c, fstar=None) if c is cell else c for c in d["cells"]])
    assert f"{net}/{cond}/p32" not in M.study_file(gone, w.recs)["cells"]


def test_pushsum_runs_share_an_event_order_where_each_push_lands_before_the_next_drain(tmp_path):
    """Clock-only runs (``crossover/clock_trace.py``, in this process) of one push-sum configuration:
    under ``none`` the fast networks (titanx-fdr, a100-ib100) have one event order on different
    clocks; on 10 GbE a push lands a drain later, another order."""
    import contextlib
    import io
    import json
    from crossover import clock_trace
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps(dict(num_classes=10, splits=dict(
        train=dict(count=1024), val=dict(count=200)))))
    got = {}
    for net in ("titanx-fdr-resnet18", "a100-ib100-resnet50", "v100-10gbe-resnet50"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            clock_trace.main(["--config", str(M.ROOT / "jobs" / "glyphs.toml"), "--data", str(data),
                              *M.flags("pushsum-ov", "L0.04", "flat"), "--seed", "0", "--workers", "4",
                              "--epochs", "2", "--eval-every", "1", "--profile", net, "--condition", "none",
                              "--run-dir", str(tmp_path / net)])
        got[net] = json.loads(out.getvalue())
        assert [s for s, _ in got[net]["history"]] == [1024, 2048]
    fast, ib, slow = got.values()
    assert fast["trace"] == ib["trace"] != slow["trace"]
    assert fast["history"][-1][1] > 1.5 * ib["history"][-1][1]
    assert clock_trace.trace_digest(tmp_path / "v100-10gbe-resnet50") == slow["trace"]


def test_a_pushsum_run_takes_its_twins_errors_on_its_own_clock():
    """``twin``: a record of the same configuration, seed and split whose run had this event order
    and whose clock-only run had it too; ``retimed``: its errors at this run's clock."""
    run = ("rep", "pushsum-ov", "flat", 16, "L0.04204", 3, "a100-ib100-resnet50", "none")
    donor = dict(key=M.run_key("rep", "pushsum-ov", "flat", 16, "L0.04204", 3, "titanx-fdr-resnet18", "none"),
                 kind="rep", method="pushsum-ov", agents="flat", workers=16, config="L0.04204", seed=3,
                 network="titanx-fdr-resnet18", condition="none", diverged=False, final_error=0.3,
                 curve=[dict(samples=10, seconds=30.0, error=0.6), dict(samples=20, seconds=60.0, error=0.3)],
                 trace="abc", clock_trace="abc", clock_same=True)
    recs = {donor["key"]: donor}
    assert M.twin(recs, run, "abc") is donor
    assert M.twin(recs, run, "abd") is None                                 # another order
    assert M.twin(recs, (*run[:5], 4, *run[6:]), "abc") is None             # another seed
    assert M.twin(recs, ("tune", *run[1:]), "abc") is None                  # another split
    for bad in (dict(clock_trace="abd"), dict(clock_same=False)):          # its clock-only run differed
        assert M.twin({donor["key"]: {**donor, **bad}}, run, "abc") is None
    rec = M.retimed(run, donor, dict(history=[[10, 11.0], [20, 22.0]], trace="abc", seconds=25.0))
    got = [(c["samples"], c["seconds"], c["error"]) for c in rec["curve"]]
    assert got == [(10, 11.0, 0.6), (20, 22.0, 0.3)]
    assert rec["key"] == M.run_key(*run) and rec["retimed_from"] == donor["key"]
    assert rec["final_error"] == 0.3 and rec["real_seconds"] == 25.0
    assert M.twin({rec["key"]: rec}, ("rep", *run[1:6], "titanx-fdr-resnet18", "none"), "abc") is rec
    w = finished(0.05, 0.5)                                                 # status counts it and its saving
    d = M.summary({**w.recs, donor["key"]: {**donor, "real_seconds": 505.0}, rec["key"]: rec})
    assert d["twins"]["runs"] == 1 and d["twins"]["machine_hours_saved"] == pytest.approx(480.0 / 3600)
    with pytest.raises(RuntimeError, match="validations"):
        M.retimed(run, donor, dict(history=[[10, 11.0], [21, 22.0]], trace="abc", seconds=1.0))


def test_a_run_whose_networks_shared_an_event_order_is_planned_at_a_clock_only_runs_cost():
    """``order_peers``: networks whose records of one run had one order; a push-sum run with a record
    on such a network is a likely twin, planned at ``TWIN_COST_S``; every other run at a whole run's."""
    base = dict(kind="tune", method="pushsum-ov", agents="flat", workers=16, config="L0.04204",
                condition="none", clock_same=True)
    recs = {"a0": dict(base, seed=100, network="titanx-fdr-resnet18", trace="x"),
            "b0": dict(base, seed=100, network="a100-ib100-resnet50", trace="x"),
            "c0": dict(base, seed=100, network="v100-10gbe-resnet50", trace="y"),
            "a1": dict(base, seed=101, network="titanx-fdr-resnet18", trace="z")}
    assert M.order_peers(recs) == {frozenset(("titanx-fdr-resnet18", "a100-ib100-resnet50"))}
    run = ("tune", "pushsum-ov", "flat", 16, "L0.04204", 101, "a100-ib100-resnet50", "none")
    assert M.likely_twin(run, recs, M.order_peers(recs)) and M.run_cost(run, recs) == M.TWIN_COST_S
    for other in ((*run[:6], "v100-10gbe-resnet50", "none"),      # a network of another order
                  (*run[:5], 102, *run[6:]),                        # no record of its seed
                  (*run[:7], "stragglers")):                        # nor of its condition
        assert not M.likely_twin(other, recs, M.order_peers(recs)) and M.run_cost(other, recs) > 100
    assert not M.likely_twin(run, {**recs, "a1": {**recs["a1"], "clock_same": False}}, M.order_peers(recs))
    assert M.run_cost(run) == M.run_cost(("rep", "allreduce", "flat", 16, "L0.07", 0, None, None), recs)
