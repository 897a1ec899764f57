"""The crossover study's driver and analysis (benchmarks/crossover/: study, report) on a
fake study: runs are "executed" by writing the records a known model of each method predicts, until
the driver has nothing left to run; then its choices, horizons, extra seeds, cells, ties and
crossover brackets are checked against that model."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

from crossover import claims as C
from crossover import driver as D
from crossover import markdown as M
from crossover import report as R
from crossover import store
from crossover import study as X

# seconds per sample per network (before the method's own cost); the methods' communication
NET = {"titanx-fdr-resnet18": 1.0, "a100-ib100-resnet50": 0.4, "v100-10gbe-resnet50": 0.9}
COMM = {"allreduce": 0.1, "localsgd": 0.05, "easgd": 0.3, "asgd": 0.5, "gossip-pull": 0.2, "pushsum-ov": 0.02,
        "single": 0.0}
ETH = {"allreduce": 2.0, "localsgd": 0.3, "pushsum-ov": 0.1}          # extra cost on Ethernet
STRAGGLE = {"allreduce": 1.6, "localsgd": 1.3, "single": 1.0}          # x under stragglers (sync only)


def base(method: str) -> str:
    m = X.AUTHORS.get(method, (method,))[0]
    return "gossip-pull" if m == "gossip-pull-np" else m


def samples(method: str, config: str, p: int, seed: int) -> float | None:
    """Samples to target: the methods' statistical efficiency (push-sum loses it at large p), a
    best rate per rule, seed noise."""
    method = base(method)
    rule, rate, _ = X.parse(config)
    start = {"single": 60e3, "allreduce": 60e3 * (1 + 8 * p / 1200), "localsgd": 70e3 * (1 + 8 * p / 1200),
            "easgd": 90e3, "asgd": 100e3, "gossip-pull": 80e3, "pushsum-ov": 62e3 * (1 + p / 4)}[method]
    best = {"F": 0.2 if method != "single" else 0.05, "L": 0.05, "W": 0.4}[rule]
    s = start * (1 + abs(np.log2(rate / best)) * 0.2) * (1 + 0.03 * (seed % 7))
    return None if method == "asgd" and rule == "L" else s          # A-SGD misses with linear scaling


def spp(method: str, network: str, condition: str, p: int) -> float:
    slow = 1.35 if X.AUTHORS.get(method, ("",))[0] == "gossip-pull-np" else 1.0   # no progress thread
    method = base(method)
    c = COMM[method] + (ETH.get(method, 0.5) if network.startswith("v100") else 0.0)
    f = STRAGGLE.get(method, 1.0) if condition == "stragglers" else 1.0
    return NET[network] * (1 + c) * f * slow / 8 / p


def record(run: X.Run) -> dict:
    s = samples(run.method, run.config, run.workers, run.seed)
    cap = run.epochs * 51_200
    reached = s is not None and s <= cap
    stop = s if reached else cap

    def curve(net, cond):
        k = spp(run.method, net, cond, run.workers)
        return [dict(samples=stop / 2, seconds=stop / 2 * k, error=0.6),
                dict(samples=stop, seconds=stop * k, error=0.39 if reached else 0.55)]
    own = curve(run.network, run.condition)
    rec = dict(key=run.key, kind=run.kind, method=run.method, workers=run.workers, config=run.config,
               seed=run.seed, network=run.network, condition=run.condition, epochs=run.epochs,
               samples_to_target=stop if reached else None, final_error=own[-1]["error"], diverged=False,
               seconds_per_sample=spp(run.method, run.network, run.condition, run.workers), curve=own,
               # a step dearer at larger p
               real_seconds=1.0 if run.kind != "time" else 1.0 + run.workers / 8,
               commit="f" * 40, worker_steps=stop / 8)
    if X.is_sync(run.method) and run.kind != "time":
        rec["retimed"] = {f"{n}/{c}": [x["seconds"] for x in curve(n, c)]
                          for n in X.NETWORKS for c in X.CONDITIONS}
    return rec


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    res = tmp_path_factory.mktemp("xo")
    mp = pytest.MonkeyPatch()
    mp.setattr(X, "RESULTS", res)
    mp.setattr(X, "WORKERS", (2, 8))
    mp.setattr(R, "BOOT", 400)
    mp.setattr(C, "BOOT", 400)
    rounds = 0
    while True:
        ready, waiting = X.Study().plan()
        if not ready:
            break
        for run in ready:
            path = X.RESULTS / f"{run.key}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(__import__("json").dumps(record(run)))
        rounds += 1
        assert rounds < 40
    yield X.Study(), waiting, R.analyse(X.Study())
    mp.undo()


def test_the_driver_runs_every_piece_to_the_end(study):
    st, waiting, res = study
    assert waiting == [] and res["left"] == dict(ready=0, waiting=0, ready_hours=0)
    t = res["tuning"]["allreduce/p8"]
    assert t["base_points"] == 4 and t["runs"] >= 8 and all(c["done"] == 2 for c in t["configs"].values())
    # every method gets the same number of configurations: its 4, ADAPTIVE more and the settings
    # step; only a choice still on an edge adds more (up to EDGE_MORE), and then none is left there
    for m in X.METHODS:
        g = st.grid(m, 8)
        assert 4 + X.ADAPTIVE + 1 <= len(g) <= 4 + X.ADAPTIVE + 1 + X.EDGE_MORE, (m, g)
        assert res["tuning"][f"{m}/p8"]["runs"] == len(g) * len(X.TUNE_SEEDS)
        edge = [n for n in X.NETWORKS if st.on_edge(st.chosen(m, 8, n), g)]
        assert (len(g) == 4 + X.ADAPTIVE + 1 + X.EDGE_MORE) or not edge, (m, g, edge)
        assert res["tuning"][f"{m}/p8"]["edge"] == edge
    # the model's best rates are F0.2, L0.05 and W0.4.  All-reduce: L0.05 sits on the upper edge of
    # its rule's rates (0.0125, 0.05): L0.1 is tried, loses, then L0.05 is inside and the rate halfway
    # to its better neighbour is tried.  A-SGD's W0.2 sits on the lower edge of (0.2, 0.8): W0.1 is
    # tried and loses; then halfway towards 0.8, W0.4, its best rate, is found and chosen
    g = st.grid("allreduce", 8)
    assert g[4] in ("L0.1", "F0.4"), g
    assert st.grid("asgd", 8)[4:6] == ["W0.1-a1", "W0.4-a1"]
    assert st.chosen("asgd", 8, "a100-ib100-resnet50") == "W0.4-a1"
    # the settings step: the choice's rate with A-SGD's other settings (n_sync 4, 4 servers), which
    # the base grid tried only at W0.8 and L0.0125; all-reduce, without settings, one more rate
    assert st.grid("asgd", 8)[6] == "W0.4-a4" and "--servers 4" in " ".join(X.flags("asgd", "W0.4-a4", 8))
    assert X.parse(st.grid("allreduce", 8)[6])[2] == "" and st.grid("allreduce", 8)[6] not in g[:6]
    assert X.Study.other_settings("localsgd", ["F0.05-t4"], "F0.05-t4") == "F0.05-t16m"
    assert X.Study.other_settings("localsgd", ["F0.05-t4", "F0.05-t16m"], "F0.05-t4") is None
    assert X.Study.other_settings("allreduce", [], "F0.05") is None


def test_a_choice_on_an_edge_under_any_network_extends_the_grid(monkeypatch):
    """The tuning network's choice sits inside its rates but another network's sits on the lowest:
    the grid goes past that edge, at most EDGE_MORE times, while a choice stays on one."""
    scores = {"F0.05-e1": 5.0, "F0.2-e4": 9.0, "L0.05-e4": 9.0, "L0.0125-e1": 9.0}
    st = X.Study.__new__(X.Study)

    def score(m, p, c, n):                  # under v100: the lower the F rate the better, all the way
        rule, rate, _ = X.parse(c)
        if n.startswith("v100") and rule == "F":
            return (0, rate)
        return (0, scores.get(c, 7.0 + rate))
    monkeypatch.setattr(st, "score", score, raising=False)
    g = st.grid("easgd", 8)
    base = 4 + X.ADAPTIVE + 1
    assert len(g) == base + X.EDGE_MORE, g
    assert [X.parse(c)[1] for c in g[base:]] == [min(X.parse(c)[1] for c in g[:base] if c[0] == "F") / 2 ** k
                                                   for k in (1, 2)]
    assert st.chosen("easgd", 8, "v100-10gbe-resnet50", g) == g[-1]      # still the edge: the cap stops it
    assert st.grid_state("easgd", 8) == (g, True) and st.chosen("easgd", 8, "v100-10gbe-resnet50") == g[-1]
    # while a network cannot score the newest configuration yet (its timing run to come), the
    # search is not over, and no network has a choice: no sweep starts from a grid that may grow
    newest = g[-1]
    monkeypatch.setattr(st, "score",
                        lambda m, p, c, n: None if (c, n[:4]) == (newest, "v100") else score(m, p, c, n),
                        raising=False)
    assert st.grid_state("easgd", 8) == (g, False)
    assert all(st.chosen("easgd", 8, n) is None for n in X.NETWORKS)

def test_status_projects_the_open_p_by_their_samples_to_target(study):
    st, _, _ = study
    total = sum(r["real_seconds"] for r in st.recs.values()) / 3600
    done = D.projection(st, [], [], total)
    assert "p =   8:" in done and ", open" not in done and \
        f"the study about {total:.1f}–{total:.1f} machine-hours" in done
    per = {p: sum(r["real_seconds"] for r in st.recs.values() if r["workers"] == p and r["kind"] in
                  ("tune", "time", "sweep")) / 3600 for p in X.WORKERS}
    ks = {p: per[p] / st.best_samples(p) for p in X.WORKERS}
    assert f"{sum(ks.values()) / len(ks) * 1e5:.2f} per 100k samples to target (the costliest " \
           f"{max(ks.values()) * 1e5:.2f}, p = {max(ks, key=ks.get)})" in done and \
        "the open p need" not in done

    def ms(p):         # real milliseconds per worker-step of p's time runs
        recs = [r for r in st.recs.values() if r["workers"] == p and r["kind"] == "time"]
        return 1e3 * sum(r["real_seconds"] for r in recs) / sum(r["worker_steps"] for r in recs)
    assert ms(8) == pytest.approx(1.6 * ms(2))     # the fake's time runs: the same steps, dearer at p = 8
    assert f"a worker-step costing {ms(2):.2f}, {ms(8):.2f} ms at p = 2, 8;" in done
    # a p swept in full that has runs to do again (a wider search): reopened, its ready runs counted
    run = X.Run("tune", "allreduce", 2, "F0.1", 100, X.TUNE_NETWORK, X.TUNE_CONDITION, epochs=3)
    again = D.projection(st, [run], [], total)
    assert f"machine-hours, reopened (at least {run.cost / 3600:.2f} machine-hours ready now)" in \
        again.splitlines()[1]
    assert f"the reopened p at least {run.cost / 3600:.1f} (their runs ready now" in again
    part = D.projection(st, [], ["sweep easgd p8 titanx-fdr-resnet18: tuning"], total)
    assert "machine-hours, open" in part.splitlines()[2] and \
        f"{per[2]:.2f} machine-hours on average (1 of them)" in part
    # p = 8 costs p = 2's machine-hours per sample to target, scaled by its cost per worker-step
    # against p = 2's, times its own samples to target
    k = per[2] / st.best_samples(2)
    assert f"{k * 1e5:.2f} per 100k samples to target (the costliest {k * 1e5:.2f}, p = 2)" in part
    assert f"p = 8: {st.best_samples(8) / 1e3:.0f}k at {ms(8):.2f} ms (samples to target;" in part
    assert "a doubling" not in part                   # measured, not grown
    left = max(0.0, k / ms(2) * ms(8) * st.best_samples(8) - per[8])
    own = part.split("P3 about ")[1].split(":")[0]
    assert part.endswith(f"the study about {total + left + float(own):.1f}–{total + left + float(own):.1f} "
                         "machine-hours in all")
    # a p without pilots or time runs yet: its samples grown from the last measured p by the last
    # doubling's growth, its worker-step at the last measured p's cost
    mp = pytest.MonkeyPatch()
    mp.setattr(X, "WORKERS", (2, 8, 32))
    try:
        more = D.projection(st, [], [], total)
    finally:
        mp.undo()
    grow = (st.best_samples(8) / st.best_samples(2)) ** 0.5
    assert f"p = 32: {st.best_samples(8) * grow ** 2 / 1e3:.0f}k (grown) at {ms(8):.2f} ms (p = 8's)" in more
    assert f"(samples to target, x{grow:.2f} a doubling" in more


def test_the_authors_rows_and_the_n_sync_runs(study):
    st, _, _ = study
    for name in X.AUTHORS:
        for p in X.WORKERS:
            conds = ("typical",) if X.is_sync(name) else X.AUTHORS_CONDITIONS
            for cond in conds:
                for s in X.SEEDS:
                    r = st.get(X.Run("authors", name, p, X.AUTHORS[name][1], s, X.AUTHORS_NETWORK, cond))
                    assert r is not None, (name, p, cond, s)
    # the cells' extra-seeds rule holds of the authors' rows too, and P1's two sides get every seed
    five, close = {*X.SEEDS, *X.MORE_SEEDS}, 0
    for p in X.WORKERS:
        for cond in X.AUTHORS_CONDITIONS:
            for name in X.AUTHORS:
                seeds = set(st.authors_seed_times(p, name, cond))
                near = name in st.authors_close(p, cond)      # (a synchronous row's seeds serve both)
                close += near
                near = near or X.is_sync(name) and any(name in st.authors_close(p, k)
                                                       for k in X.AUTHORS_CONDITIONS)
                assert seeds == (five if near or (name == "asgd-authors" and p == X.P1_P)
                                 else set(X.SEEDS)), (p, cond, name, seeds)
            rows = C.authors_rows(st, p, cond)
            assert all(set(r["seeds"]) == set(st.authors_seed_times(p, n, cond)) for n, r in rows.items())
    assert close, "the model has no authors' rows within CLOSE"
    assert set(st.seed_times(1, X.TUNE_NETWORK, X.TUNE_CONDITION, "single")) == five
    for n in X.NETWORKS:
        assert set(st.seed_times(X.P1_P, n, "typical", "asgd")) == five, n
    assert "--mpi-progress none" in " ".join(X.flags("gossip-authors", "F0.05", 8))
    n100 = st.get(X.Run("extra", "asgd", 4, "W0.2-a100", 0, X.TUNE_NETWORK, X.TUNE_CONDITION))
    assert n100 is not None and "--n-sync 100" in " ".join(X.flags("asgd", n100["config"], 4))


def test_horizons_follow_the_pilots_and_the_synchronous_best(study):
    st, _, _ = study
    best = st.best_samples(8)
    assert st.tune_epochs(8) == max(X.MIN_EPOCHS,
                                    min(X.MAX_EPOCHS, int(np.ceil(X.CAP_SAMPLES * best / 51_200))))
    c = st.chosen("easgd", 8, "v100-10gbe-resnet50")
    e = st.sweep_epochs("easgd", 8, c, "v100-10gbe-resnet50", "none")
    sync = st.cell_sync_best(8, "v100-10gbe-resnet50", "none")
    assert e == max(2, min(X.MAX_EPOCHS, int(np.ceil(X.CAP_TIME * sync / st.seconds_per_sample(
        "easgd", 8, c, "v100-10gbe-resnet50") / 51_200))))


def test_cells_rank_tie_and_add_seeds_where_close(study):
    st, _, res = study
    ib = res["cells"]["a100-ib100-resnet50/none/p2"]
    means = {m: r["mean_seconds"] for m, r in ib["methods"].items() if r["mean_seconds"] is not None}
    assert ib["fastest"] == min(means, key=means.get)
    close = [(n, cond, p, m) for n in X.NETWORKS for cond in X.CONDITIONS for p in X.WORKERS
             for m in st.close_methods(p, n, cond)]
    assert len(close) >= 4, close
    for n, cond, p, m in close:                  # the close pairs got the extra seeds, paired
        seeds = res["cells"][f"{n}/{cond}/p{p}"]["methods"][m]["seeds"]
        assert set(seeds) == {*X.SEEDS, *X.MORE_SEEDS}, (n, cond, m)
    eth = res["cells"]["v100-10gbe-resnet50/stragglers/p2"]
    assert eth["fastest"] == "pushsum-ov"                 # cheap on Ethernet, efficient at small p


def test_a_run_stopped_at_the_cap_is_labelled_so_never_missed(study):
    """An asynchronous run whose horizon the cap set short of MAX_EPOCHS and that did not reach the
    target was stopped at the cap ("cap"); one that ran MAX_EPOCHS and missed, "horizon"."""
    st, _, res = study
    run = dict(kind="sweep", method="easgd", epochs=X.MAX_EPOCHS - 1, diverged=False)
    assert X.stopped(run, None) == "cap" and X.stopped(run, 12.0) == "target"
    assert X.stopped(dict(run, epochs=X.MAX_EPOCHS), None) == "horizon"
    assert X.stopped(dict(run, diverged=True), None) == "diverged"
    assert X.stopped(dict(run, method="allreduce"), None) == "horizon"      # (no cap on a synchronous run)
    assert X.stopped(dict(run, kind="extra"), None) == "horizon"            # (P3: its fixed horizon)
    assert X.stopped(dict(run, kind="authors", method="gossip-authors"), None) == "cap"
    capped = 0
    for k, cl in res["cells"].items():
        n, cond, p = k.split("/")
        for m, r in cl["methods"].items():
            for v in r["seeds"].values():
                cap = v["seconds"] is None and not X.is_sync(m) and v["epochs"] < X.MAX_EPOCHS
                assert (v["stopped"] == "cap") == cap, (k, m, v)
                capped += cap
            assert r["capped"] == sum(v["stopped"] == "cap" for v in r["seeds"].values())
            best = None if X.is_sync(m) else st.cell_sync_best(int(p[1:]), n, cond)
            assert r["cap_seconds"] == (None if best is None else X.CAP_TIME * best)
    assert capped and res["decided_by_cap"]["seeds"]["async"]["cap"] == capped


def test_a_call_the_cap_decided_says_so_wherever_it_is_shown(tmp_path):
    """A cell whose asynchronous methods were all stopped at the cap: its families' call, the claims'
    evidence and verdict, the map and the cells table say "decided by the cap", never "missed"."""
    import report  # noqa: PLC0415  (benchmarks/report.py)

    def row(secs, stopped=None):
        seeds = {s: dict(seconds=t, final_error=0.39 if t else 0.6,
                         **({} if stopped is None else {"stopped": "target" if t else stopped}))
                 for s, t in enumerate(secs)}
        ok = None not in secs
        return dict(seeds=seeds, reached_all=ok, mean_seconds=sum(secs) / len(secs) if ok else None,
                    capped=sum(v.get("stopped") == "cap" for v in seeds.values()))
    rows = dict(allreduce=row([10.0, 11.0], "horizon"), easgd=row([None, None], "cap"),
                **{"pushsum-ov": row([25.0, None], "cap")})
    call = R.family_call(rows)
    assert call["family"] == "sync" and call["by_cap"] and call["capped"] == ["easgd", "pushsum-ov"]
    said = C._say(64, C.compare(rows, C.SYNC_SIDE, C.ASYNC_SIDE))
    assert "easgd, pushsum-ov stopped at the cap (2× the best synchronous time of the cell)" in said and \
        said.endswith("→ decided by the cap") and "missed" not in said, said
    # a method that ran its whole horizon and missed is named as such beside those stopped at the cap
    mixed = dict(rows, easgd=row([None, None], "horizon"))
    said = C._say(64, C.compare(mixed, C.SYNC_SIDE, C.ASYNC_SIDE))
    assert "pushsum-ov stopped at the cap" in said and "easgd missed it → decided by the cap" in said
    # every method of the side missed at its horizon (or an older analysis without "stopped"): missed
    for gone in (dict(mixed, **{"pushsum-ov": row([25.0, None], "horizon")}),
                 dict(allreduce=row([10.0, 11.0]), easgd=row([None, None]))):
        said = C._say(64, C.compare(gone, C.SYNC_SIDE, C.ASYNC_SIDE))
        assert not R.family_call(gone)["by_cap"] and "cap" not in said, said
    # the claims: the p the cap decided, and the verdict marked with them
    cell = dict(workers=64, complete=True, fastest="allreduce", tied=[], methods=rows, decided_by_cap=True)
    res = dict(workers=[1, 64], networks=["n"], conditions=["none"], cells={"n/none/p64": cell},
               crossovers={"n/none": dict(outcome="no crossing in range: sync at every p (64-64)", shares={},
                                          per_p={"64": dict(family="sync", by_cap=True)})})
    v = C.family_row(res, "J2", "n", "none", (64,), C.SYNC_SIDE, C.ASYNC_SIDE)
    assert v["verdict"] == "agrees" and v["decided_by_cap"] == [64] and "decided by the cap" in v["evidence"]
    assert "**agrees** (decided by the cap at p = 64) |" in M.claims_markdown(dict(verdicts=[v]))
    # the map: the cell marked, the legend under its network, the family's p said
    md = M.map_markdown(res)
    assert f"**all-reduce** 10.5 s {M.CAP_MARK} |" in md and M.CAP_LEGEND in md
    assert "synchronous first at p = 64 (decided by the cap at p = 64)" in md
    assert M.per_p_words({"32": dict(family="sync"), "64": dict(family="sync", by_cap=True),
                          "128": dict(family="sync", by_cap=True)}) == \
        "synchronous first at p = 32–128 (decided by the cap at p = 64–128)"
    assert M.say_segments(M.segments(res, "n", "none")) == \
        "synchronous at p = 64 (all-reduce; decided by the cap at p = 64)"
    # the cells table: the seeds that did not reach the target were stopped at the cap
    (tmp_path / "crossover.json").write_text(json.dumps(res))
    table = report.crossover_cells(tmp_path)
    assert "| EASGD | 0/2 (60%, cap) |" in table and "| push-sum | 1/2 (60%, cap) |" in table


def test_the_extra_seeds_rule_holds_of_the_cell_as_reported(study):
    """Every cell ends with every method within CLOSE of its fastest (by the mean over every seed
    each has) on all five seeds: the rule is not only about the first two seeds, nor only about the
    two fastest, so no call within 25% rests on two seeds."""
    _, _, res = study
    near_any = 0
    for key, cell in res["cells"].items():
        means = {m: r["mean_seconds"] for m, r in cell["methods"].items() if r["mean_seconds"] is not None}
        best = min(means.values(), default=None)
        near = [m for m, v in means.items() if v <= X.CLOSE * best]
        if len(near) >= 2:
            near_any += len(near) > 2
            for m in near:
                assert set(cell["methods"][m]["seeds"]) == {*X.SEEDS, *X.MORE_SEEDS}, (key, m)
        for m, r in cell["methods"].items():     # and so no tie in a cell is a too-few-seeds tie
            assert not (r.get("vs_fastest") or {}).get("few"), (key, m)
    assert near_any, "the model has no cell with three methods within CLOSE"


def test_close_methods_ranks_again_over_the_extra_seeds(monkeypatch):
    """all-reduce and local SGD were close on seeds 0-1 and got seeds 2-4; over them all-reduce
    slowed to 12.4 and local SGD to 13.2, so push-sum (12.6 on its two seeds) is now second and
    within CLOSE of the leader: it gets the seeds too.  Not before the extra seeds are all in, and a
    method that missed a seed is not ranked (as in the report)."""
    two = {"allreduce": [10.0, 10.0], "localsgd": [12.0, 12.0], "pushsum-ov": [12.6, 12.6],
           "easgd": [30.0, 31.0]}
    extra = {"allreduce": [14.0, 14.0, 14.0], "localsgd": [14.0, 14.0, 14.0]}
    st = X.Study.__new__(X.Study)
    monkeypatch.setattr(st, "seed_times", lambda p, n, c, m: dict(zip((*X.SEEDS, *X.MORE_SEEDS),
                                                                      two.get(m, []) + extra.get(m, []))),
                        raising=False)
    close = lambda: st.close_methods(8, "a100-ib100-resnet50", "none")      # noqa: E731
    assert close() == ["allreduce", "localsgd", "pushsum-ov"]
    extra["allreduce"] = [14.0]                   # all-reduce's seeds 3-4 still running: wait
    assert close() == ["allreduce", "localsgd"]
    extra["allreduce"] = [14.0, None, 14.0]       # all-reduce missed seed 3: push-sum leads, local SGD close
    assert close() == ["allreduce", "localsgd", "pushsum-ov"]
    extra["allreduce"], two["pushsum-ov"] = [10.0, 10.0, 10.0], [20.0, 20.0]
    assert close() == ["allreduce", "localsgd"]   # the same two lead over every seed: nobody new
    two["localsgd"], extra = [20.0, 20.0], {}     # nothing close on seeds 0-1: no extra seeds at all
    assert close() == []
    two.update({"localsgd": [11.0, 11.0], "pushsum-ov": [12.4, 12.4]})   # three within CLOSE: all three
    assert close() == ["allreduce", "localsgd", "pushsum-ov"]


def test_crossover_brackets_and_their_shares(study):
    _, _, res = study
    # push-sum (async) first at small p on Ethernet, losing statistical efficiency as p grows
    x = res["crossovers"]["v100-10gbe-resnet50/stragglers"]
    assert x["outcome"].startswith("async -> sync in [")
    assert abs(sum(x["shares"].values()) - 1) < 1e-9 and max(x["shares"], key=x["shares"].get) == x["outcome"]
    assert x["per_p"][2]["family"] == "async" and x["per_p"][8]["family"] == "sync"
    assert (x["per_p"][2]["claim"], x["per_p"][8]["other"]) == ("pushsum-ov", res["cells"][
        "v100-10gbe-resnet50/stragglers/p8"]["fastest"])
    one = res["crossovers"]["a100-ib100-resnet50/none"]
    assert one["outcome"].startswith(("no crossing in range", "async -> sync"))
    study_file = R.study_file(res)
    assert study_file["complete"] and set(study_file["cells"]) == set(res["cells"])


def test_paired_intervals_and_the_noise_scale():
    rng = np.random.default_rng(0)
    d = R.paired_interval({0: 10.0, 1: 11.0, 2: 12.0}, {0: 9.0, 1: 10.0, 2: 11.5})
    assert d["mean"] == pytest.approx(2.5 / 3) and 0 < d["lo"] <= d["hi"]
    tie = R.paired_interval({0: 10.0, 1: 9.0}, {0: 9.0, 1: 10.0})
    assert tie["lo"] < 0 < tie["hi"]
    assert R.paired_interval({0: 1.0}, {0: 2.0}) is None
    # one difference, one interval, wherever it is judged: a map cell and a claim agree to the bit
    a = dict(enumerate([10.0, 11.0, 9.0, 10.5, 10.0]))
    b = dict(enumerate([10.2, 10.5, 9.4, 10.2, 10.1]))
    rows = {"x": dict(reached_all=True, mean_seconds=np.mean(list(a.values())),
                      seeds={s: dict(seconds=v) for s, v in a.items()}),
            "y": dict(reached_all=True, mean_seconds=np.mean(list(b.values())),
                      seeds={s: dict(seconds=v) for s, v in b.items()})}
    c, d = C.compare(rows, ("x",), ("y",)), R.paired_interval(a, b)
    assert (c["lo"], c["hi"]) == (d["lo"], d["hi"]) and d["lo"] < 0 < d["hi"] and c["pick"] is None
    assert C.resamples(5).shape == (C.BOOT, 5) and C.resamples(5) is C.resamples(5)
    assert not C.resamples(5).flags.writeable
    assert not np.array_equal(C.resamples(5, 1), C.resamples(5, 2))      # an unpaired ratio's two sides
    # steps that halve with every doubling of the batch: no positive S_min, B_noise not resolved
    flat = R.fit_noise([(8, [10150.0, 10000.0]), (16, [4969.0, 5000.0]), (32, [2578.0, 2500.0]),
                        (64, [1009.0, 1100.0])], rng)
    assert not flat["resolved"] and flat["b_noise"] is None and flat["unresolved_share"] > 0.9
    assert R.workload(flat)["factor"] is None
    # S = 200 (1 + 32 / B) with seed noise: resolved, the interval around 32
    ns = R.fit_noise([(b, [200 * (1 + 32 / b) + e for e in (-4.0, 0.0, 4.0)]) for b in (8, 16, 32, 64)], rng)
    assert ns["resolved"] and ns["b_noise"] == pytest.approx(32, rel=0.01)
    assert ns["b_noise_lo"] < 32 < ns["b_noise_hi"] and ns["s_min"] == pytest.approx(200, rel=0.01)
    assert R.workload(ns)["bound"] == ""
    assert R.fit_noise([(8, [1.0]), (16, [0.5])], rng)["b_noise"] is None
    # a finite point fit that many resamples cannot repeat: not resolved, the fit kept aside (every
    # batch far below a noise scale of 5,000, each seed 20% either side); with 5% it is resolved
    means = {b: 100 * (1 + 5000 / b) for b in (8, 16, 32, 64, 128, 256, 512)}
    noisy = R.fit_noise([(b, [v * 0.8, v * 1.2]) for b, v in means.items()], rng)
    assert noisy["b_noise_fit"] == pytest.approx(5000) and noisy["unresolved_share"] > 0.025
    assert not noisy["resolved"] and noisy["b_noise"] is None and noisy["b_noise_lo"] is not None
    quiet = R.fit_noise([(b, [v * 0.95, v * 1.05]) for b, v in means.items()], rng)
    assert quiet["resolved"] and quiet["b_noise_lo"] < 5000 < quiet["b_noise_hi"]
    # the fit weighs relative residuals: the study's means at p = 1-64 (steps 10,150 at B = 8 to 242
    # at 512) give a positive S_min; unweighted squares, led by the smallest batches, gave none
    study = {8: 10150, 16: 4901, 32: 2553, 64: 1030, 128: 711, 256: 379, 512: 242}
    got = R.fit_noise([(b, [v * 0.97, v * 1.03]) for b, v in study.items()], rng)
    assert got["resolved"] and 500 < got["b_noise"] < 1200 and np.polyfit(
        [1 / b for b in study], list(study.values()), 1)[1] < 0


def test_small_sample_calls_are_not_overconfident():
    """The expanded percentile interval at 5 seeds, a tie within CLOSE on 2 seeds, a family that
    missed the target losing its p, and the crossover's resamples paired within a cell."""
    assert C.tail(5) == pytest.approx(0.00096, abs=2e-5) and C.tail(100) == pytest.approx(0.0231, abs=5e-4)
    assert C.t975(4) == 2.776 and C.t975(30) == pytest.approx(2.042, abs=1e-3)
    # one straggling seed: the plain 2.5-97.5 percentile interval excludes 0, the expanded does not
    d = np.array([23.9, -19.1, 240.7, 39.5, 53.8])
    plain = np.percentile(d[C.resamples(5)].mean(axis=1), [2.5, 97.5])
    lo, hi = C.boot_interval(d)
    assert plain[0] > 0 and lo < 0 < hi
    a = {s: 100.0 + 10 * s for s in range(5)}
    call = C.paired(a, {s: v + 5.0 for s, v in a.items()})       # 5 s faster on every one of 5 seeds
    assert call["call"] == "a" and not call["few"] and call["hi"] == pytest.approx(-5.0)
    two = C.paired({0: 100.0, 1: 120.0}, {0: 110.0, 1: 125.0})   # 7% apart on 2 seeds: not separated
    assert two["few"] and two["call"] == "tie" and two["hi"] < 0
    far = C.paired({0: 100.0, 1: 120.0}, {0: 200.0, 1: 260.0})   # 2x apart: separated on 2 seeds
    assert not far["few"] and far["call"] == "a"
    # closeness by each one's mean over all its seeds (as the driver gives extra seeds): a leader
    # whose extra seeds ran fast is more than 25% ahead of a method it ties with on seeds 0-1
    lead = {0: 100.0, 1: 110.0, 2: 60.0, 3: 60.0, 4: 60.0}
    other = C.paired({0: 115.0, 1: 125.0}, lead)
    assert not other["few"] and other["call"] == "b" and other["a_mean"] <= X.CLOSE * other["b_mean"]

    def rows(**times):
        return {m: dict(reached_all=None not in t, mean_seconds=None if None in t else float(np.mean(t)),
                        seeds={s: dict(seconds=v) for s, v in enumerate(t)}) for m, t in times.items()}
    # a p where every asynchronous method missed goes to the synchronous family, not out of the crossover
    assert R.family_call(rows(allreduce=[10.0, 11.0], easgd=[None, 5.0]))["family"] == "sync"
    assert R.family_call(rows(allreduce=[None, 1.0], easgd=[None, 5.0])) is None
    # the seeds vary a lot, the difference by seed not at all: paired resamples agree every time
    sync = [10.0, 20.0, 30.0, 40.0, 50.0]
    p0, p1 = X.WORKERS[:2]
    cells = {p0: dict(methods=rows(allreduce=sync, easgd=[t - 1 for t in sync])),
             p1: dict(methods=rows(allreduce=sync, easgd=[t + 1 for t in sync]))}
    x = R.crossover(cells, np.random.default_rng(0))
    assert x["outcome"] == f"async -> sync in [{p0}, {p1}]" and x["shares"] == {x["outcome"]: 1.0}
    assert x["per_p"][p0]["family"] == "async" and x["per_p"][p1]["family"] == "sync"


def test_the_claims_follow_their_rules_on_the_model(study):
    """The model's stragglers slow all-reduce 1.6x and gossip not at all; push-sum is first at
    p = 2 on Ethernet, all-reduce on InfiniBand."""
    st, _, res = study
    v = {(r["claim"], r["network"], r["condition"]): r for r in res["verdicts"]}
    assert v[("J4", "a100-ib100-resnet50", "stragglers vs typical")]["verdict"] == "agrees"
    assert "1.60x" in v[("J4", "a100-ib100-resnet50", "stragglers vs typical")]["evidence"]
    assert v[("J4b", "a100-ib100-resnet50", "stragglers vs typical")]["verdict"] == "agrees"
    eth = v[("J1 (every method)", "v100-10gbe-resnet50", "stragglers")]
    assert eth["verdict"] in ("agrees so far", "partly agrees so far") and \
        "p = 2: pushsum-ov" in eth["evidence"]
    assert "p = 16 not run yet" in eth["evidence"]                 # (this study stops at p = 8)
    assert C.verdict(["claim"], ["p = 2: ...", "p = 4 not run yet"]) == "agrees so far"
    assert C.verdict(["claim"], ["p = 2: ..."]) == "agrees" and \
        C.verdict([], ["p = 2 not run yet"]) == "not run"
    assert v[("J2", "a100-ib100-resnet50", "none")]["verdict"] == "not run"
    assert v[("J2 (the authors' forms)", "titanx-fdr-resnet18", "stragglers")]["verdict"] == "not run"
    assert v[("P3", "(statistics only)", "—")]["verdict"] in ("not comparable", "agrees", "disagrees",
                                                              "partly agrees")
    assert v[("J1 (the authors' forms)", "titanx-fdr-resnet18", "none")]["verdict"] != "not run"
    # P1: a speed-up with an interval, or "disagrees" when the 8 clients do not reach the target; the
    # model's authors' A-SGD needs more than the cap without stragglers: stopped there, never "missed",
    # and the speed-up that bound allows (above 3.2x) leaves the verdict to the cap
    pa = v[("P1 (the authors' form)", "titanx-fdr-resnet18", "stragglers")]
    assert pa["verdict"] == "disagrees" and "x [" in pa["evidence"] and \
        "W0.2-a1, untuned" in pa["evidence"], pa
    pa = v[("P1 (the authors' form)", "titanx-fdr-resnet18", "none")]
    assert pa["verdict"] == "disagrees" and "8 clients stopped at the cap" in pa["evidence"] and \
        "in 5 of 5 seeds" in pa["evidence"] and "missed" not in pa["evidence"], pa
    bound = float(pa["evidence"].split("below ")[1].split("x")[0])
    assert pa["decided_by_cap"] == ([X.P1_P] if bound >= C.PAINE else []), pa
    # without the authors' own runs their row is not run (not the tuned A-SGD's numbers)
    assert C.p1(res, "titanx-fdr-resnet18", "none", {}, "P1 (the authors' form)")["verdict"] == "not run"
    assert C.judge(["claim", "neither"]) == "agrees" and C.judge(["tie", "other"]) == "disagrees"
    assert C.judge(["tie", "tie"]) == "tie" and C.judge(["claim", "other"]) == "partly agrees"
    assert C.judge(["neither"]) == "not run"
    # some runs in, at no p all of them: said so, not "not run"
    assert C.verdict([], [f"p = 2: {C.NOT_ALL_IN}", "p = 4 not run yet"]) == "runs not all in yet"
    # J3: a side that missed the target at a rate is named, not a ratio of inf
    assert C.j3_ratio(2.0, 1.0) == "2.00" and C.j3_ratio(math.inf, 1.0) == "— (gossip missed the target)"
    assert C.j3_ratio(math.inf, math.inf) == "— (all-reduce and gossip missed the target)"
    # J4b: a p where all-reduce's slowdown is known and no gossip method's is says why
    def arm(*secs):
        return dict(reached_all=None not in secs,
                    mean_seconds=None if None in secs else sum(secs) / len(secs),
                    seeds={i: dict(seconds=t) for i, t in enumerate(secs)})
    cells = {f"n/{c}/p2": dict(methods=dict(allreduce=arm(10.0 * k, 11.0 * k),
                                            **{"pushsum-ov": arm(9.0, None)}))
             for c, k in (("typical", 1), ("stragglers", 2))}
    j4b = C.j4(dict(cells=cells), "n")[1]
    assert j4b["evidence"].startswith("p = 2: no slowdown to judge (neither gossip method reached the "
                                      "target") and \
        f"p = {X.WORKERS[1]} not run yet" in j4b["evidence"] and j4b["verdict"] == "not run"
    rows = {"a": dict(reached_all=True, mean_seconds=10.0,
                      seeds={0: dict(seconds=10.0), 1: dict(seconds=10.0)}),
            "b": dict(reached_all=True, mean_seconds=14.0,
                      seeds={0: dict(seconds=14.0), 1: dict(seconds=14.1)}),
            "c": dict(reached_all=False, mean_seconds=None,
                      seeds={0: dict(seconds=None), 1: dict(seconds=5.0)}),
            "d": dict(reached_all=True, mean_seconds=12.0,
                      seeds={0: dict(seconds=12.0), 1: dict(seconds=12.1)})}
    assert C.compare(rows, ("a",), ("b",))["outcome"] == "claim"
    near = C.compare(rows, ("a",), ("d",))          # 20% apart on two seeds: not told apart
    assert near["outcome"] == "tie" and near["few"] and "fewer than 5 seeds" in C._say(2, near)
    assert C.compare(rows, ("c",), ("b",))["outcome"] == "other"      # a missed seed loses
    assert C.compare(rows, ("c",), ("c",))["outcome"] == "neither"


def test_a_sides_pick_is_made_again_inside_every_resample():
    """Two methods a side: the difference is of each side's fastest mean on the common seeds, and
    its interval has the pick made again in every resample, reflected about that difference (the
    basic interval: a resampled minimum is biased low); a method with fewer seeds (or a missed one)
    is no candidate; one a side: the paired interval, unchanged."""
    def row(xs):
        return dict(reached_all=None not in xs, mean_seconds=None if None in xs else float(np.mean(xs)),
                    seeds={s: dict(seconds=x) for s, x in enumerate(xs)})
    rows = {"x": row([10.0, 10.4, 9.6, 10.2, 9.8]), "x2": row([10.6, 9.0, 10.8, 9.1, 10.9]),
            "x3": row([20.0, 20.0]), "x4": row([None, 1.0, 1.0, 1.0, 1.0]),
            "y": row([10.3, 10.1, 10.0, 10.6, 10.2])}
    names, A = C.side_matrix(rows, ("x", "x2", "x3", "x4"), list(range(5)))
    assert names == ["x", "x2"] and A.shape == (2, 5)
    c = C.compare(rows, ("x", "x2", "x3", "x4"), ("y",))
    alone = C.compare(rows, ("x",), ("y",))
    assert alone["pick"] is None and c["claim"] == "x" and c["other"] == "y"
    assert c["diff"] == pytest.approx(10.0 - 10.24) and c["claim_mean"] == pytest.approx(10.0)
    A, B = c["pick"]
    boot = C.picked(A, B, C.resamples(5))
    # the least of two resampled means: never above x's own, below it where x2 wins
    own = A[0][C.resamples(5)].mean(axis=1) - B[0][C.resamples(5)].mean(axis=1)
    assert np.all(boot <= own + 1e-12) and np.any(boot < own - 1e-9)
    q = 100 * C.tail(5)
    assert (c["lo"], c["hi"]) == pytest.approx((2 * c["diff"] - np.percentile(boot, 100 - q),
                                                2 * c["diff"] - np.percentile(boot, q)))
    # x2 nearly ties x: the least of the two resampled means undershoots, and the reflection
    # about the observed difference moves the interval up against x's alone (no false advantage
    # for the side with more candidates)
    assert c["hi"] > alone["hi"] and c["lo"] > alone["lo"]
    # the picks are named from the common seeds: on seeds 1 and 3 alone x2 is the faster
    two = {m: dict(r, seeds={s: v for s, v in r["seeds"].items() if s in (1, 3)}) for m, r in rows.items()
           if m in ("x", "x2", "y")}
    assert C.compare(two, ("x", "x2"), ("y",))["claim"] == "x2"


def test_the_map_claims_and_figure_render(study, tmp_path):
    _, _, res = study
    md = M.map_markdown(res)
    assert "**v100-10gbe-resnet50**" in md and "| stragglers |" in md and "**push-sum**" in md
    assert "| J4 | a100-ib100-resnet50 |" in M.claims_markdown(res)
    w = R.workload(dict(b_noise=1000.0))
    assert w["factor"] == pytest.approx(8 / 1000 * 10_000 / 32) and \
        w["imagenet_gpus"][8] == pytest.approx(20.0)
    assert M.say_outcome("async -> sync in [4, 8]") == "asynchronous → synchronous between p = 4 and 8"
    assert M.say_outcome("no crossing in range: sync at every p (2-128)") == \
        "no crossing in p = 2–128: synchronous first at every p"
    # every change along p, a tie widening the bracket; ties without a change said as such
    seq = [(2, "async"), (4, "tie"), (8, "sync"), (16, "async")]
    assert R.sequence_words(seq) == "async -> sync in [2, 8] -> async in [8, 16]"
    assert M.say_outcome(R.sequence_words(seq)) == ("asynchronous → synchronous between p = 2 and 8, then → "
                                                    "asynchronous between p = 8 and 16")
    assert M.say_outcome(R.sequence_words([(2, "tie"), (4, "sync")])) == \
        "no crossing resolved in p = 2–4: synchronous first wherever the families differ"
    assert R.sequence_words([(2, "tie"), (4, "tie")]) == "no crossing in range: a tie at every p (2-4)"
    assert M.say_outcome(R.sequence_words([(2, "tie"), (4, "tie")])) == \
        "no crossing resolved in p = 2–4: the families tie at every p"
    # the map says the family at each p before the crossing it reads from them (JSON keys: str)
    per_p = {"2": dict(family="async"), "4": dict(family="tie"), "16": dict(family="tie"),
             "8": dict(family="sync"), "32": dict(family="sync"), "64": dict(family="sync")}
    assert M.per_p_words(per_p) == ("asynchronous first at p = 2 · a tie at p = 4 · synchronous first at "
                                    "p = 8 · a tie at p = 16 · synchronous first at p = 32–64")
    assert "\n* none: " in md and " first at p = " in md and ". So " in md
    assert R.sequence_words([]) == "no evidence"
    assert M.shares_text({"a": 1.0}) == " (in every bootstrap resample)"
    assert M.shares_text({"no evidence": 0.995, "x": 0.004, "y": 0.001}) == \
        " (bootstrap: >99% no evidence; <1% x; <1% y)"
    R.figure(res, tmp_path / "map.png")
    assert (tmp_path / "map.png").stat().st_size > 10_000



def test_the_cells_table_says_seeds_to_come_and_the_missed_seeds_error(tmp_path):
    """docs/results.md's every-method table: a method whose seeds so far all reached the target is
    "so far", not k/n; one that missed shows the error the seeds that missed ended at."""
    import report  # noqa: PLC0415  (benchmarks/report.py)
    cell = dict(fastest=None, complete=False, methods={
        "allreduce": dict(reached_all=False, mean_seconds=None, final_error=0.39,
                          seeds={"0": dict(seconds=30.0, final_error=0.39)}),
        "easgd": dict(reached_all=False, mean_seconds=None, final_error=0.49,
                      seeds={"0": dict(seconds=None, final_error=0.6),
                             "1": dict(seconds=20.0, final_error=0.38)})})
    (tmp_path / "crossover-progress.json").write_text(json.dumps(dict(
        workers=[1, 2], networks=["n"], conditions=["none"], cells={"n/none/p2": cell})))
    table = report.crossover_cells(tmp_path)
    assert f"| all-reduce | 30 (so far: 1 of {len(X.SEEDS)} seeds) |" in table and \
        "| EASGD | 1/2 (60%) |" in table


def test_the_answer_in_short_follows_the_map(study):
    st, _, res = study
    assert all(c["complete"] and not c["missing"] for c in res["cells"].values())
    text = M.answer_markdown(res, final=True)
    assert "so far" not in text and "so far" not in M.map_markdown(res)
    for n in X.NETWORKS:
        for cond in X.CONDITIONS:
            segs = M.segments(res, n, cond)
            # the segments cover every p > 1 in order, and each names the fastest of its cells
            assert [p for g in segs for p in X.WORKERS if g["from"] <= p <= g["to"]] == list(X.WORKERS)
            for g in segs:
                for p in X.WORKERS:
                    if g["from"] <= p <= g["to"]:
                        assert res["cells"][f"{n}/{cond}/p{p}"]["fastest"] in g["methods"]
            if "sync -> " in res["crossovers"][f"{n}/{cond}"]["outcome"]:
                assert len(segs) > 1, (n, cond, segs)
    assert text.count("\n* ") == len(X.CONDITIONS) + 3 and f"of the {M.BUDGET_HOURS:g} budgeted" in text
    assert "**The cap.** An asynchronous run stops at 2× the best synchronous time" in text
    assert f"**The horizon.** {len(res['cells'])} of {len(res['cells'])} cells are complete (all)" in text
    # a tie across the families and a miss are said as such, and networks reading alike are named together
    tie = dict(workers=[1, 2, 4], networks=["a", "b"], conditions=["none"], machine_hours_total=1.0, cells={
        **{f"{n}/none/p2": dict(fastest="pushsum-ov", tied=["allreduce"], complete=True) for n in "ab"},
        **{f"{n}/none/p4": dict(fastest=None, tied=[], complete=True) for n in "ab"}})
    assert "`a` and `b`: a tie of the families at p = 2 (push-sum, all-reduce) · no method reaches the " \
           "target in every seed at p = 4." in M.answer_markdown(tie, final=False)
    assert "**The horizon.** 4 of 4 cells are complete (all): in 2 some method reached the target in every " \
           "seed; in `a/none/p4`, `b/none/p4` none did" in M.answer_markdown(tie, final=False)
    # a run of p names each p's methods where they differ (not one list that puts a method at every p)
    run = dict(workers=[1, 2, 4, 8], networks=["a"], conditions=["none"], machine_hours_total=1.0, cells={
        "a/none/p2": dict(fastest="pushsum-ov", tied=["localsgd", "easgd"], complete=True),
        "a/none/p4": dict(fastest="pushsum-ov", tied=["allreduce", "localsgd"], complete=True),
        "a/none/p8": dict(fastest="allreduce", tied=["pushsum-ov"], complete=True)})
    assert "a tie of the families at p = 2–8 (p = 2: push-sum, local SGD; p = 4: push-sum, all-reduce, " \
           "local SGD; p = 8: all-reduce, push-sum)" in M.answer_markdown(run, final=False)
    assert "Times are simulated seconds" in text and f"to {res['target_error']:.0%} validation error" in text
    # past the budget the answer says by how much, and the worker-step cost it was set against
    assert res["ms_per_worker_step"] == pytest.approx(
        1e3 * sum(r["real_seconds"] for r in st.recs.values())
        / sum(r["worker_steps"] for r in st.recs.values()))
    over = M.budget_words(dict(machine_hours_total=M.BUDGET_HOURS + 3.25, ms_per_worker_step=5.6), final=True)
    assert over.startswith(f"The study took {M.BUDGET_HOURS + 3.25:.1f} machine-hours") and \
        f", 3.2 over the {M.BUDGET_HOURS:g} budgeted." in over
    assert f"costs 5.6 ms of one core (all of a run's real time counted), {M.STEP_SPEEDUP:g}× what the " \
           "budget assumed" in over
    assert M.budget_words(dict(machine_hours_total=1.0), final=False).endswith("of the 24 budgeted.")


def study_without(tmp_path, gone, read=R.analyse) -> tuple:
    """``read`` (the analysis unless told) of a copy of the study without the records
    ``gone(path)`` picks: (what it returned, them)."""
    import shutil
    part = tmp_path / "results"
    shutil.copytree(X.RESULTS, part)
    files = [f for f in part.rglob("*.json") if gone(f)]
    for f in files:
        f.unlink()
    mp = pytest.MonkeyPatch()
    mp.setattr(X, "RESULTS", part)
    try:
        return read(X.Study()), files
    finally:
        mp.undo()


def test_a_cell_still_running_is_marked_so_far(study, tmp_path):
    res, gone = study_without(tmp_path, lambda f: f.name.startswith("pushsum-ov-p8-") and "a100" in f.name
                              and "-none" in f.name and f.parent.name == "sweep")
    assert gone
    cl = res["cells"]["a100-ib100-resnet50/none/p8"]
    assert not cl["complete"] and cl["missing"] == ["pushsum-ov"] and res["left"]["ready"] >= len(gone)

    assert res["cells"]["a100-ib100-resnet50/typical/p8"]["complete"]
    assert 8 not in res["crossovers"]["a100-ib100-resnet50/none"]["per_p"]       # complete cells only
    assert 8 in res["crossovers"]["a100-ib100-resnet50/typical"]["per_p"]
    assert M.cell_text(cl).endswith("*(so far: 5 of 6 methods)*")
    text = M.answer_markdown(res, final=False)
    assert said_of(text, "a100-ib100-resnet50", "No variability").endswith(" · runs still to come at p = 8")
    assert "8 (" in said_of(text, "a100-ib100-resnet50", "A cluster's typical jitter")
    assert "still to come" not in said_of(text, "a100-ib100-resnet50", "A cluster's typical jitter")
    assert "(generated from the cells complete yet, every one through p = 2)" in text
    # every cell, crossover and claim the removed runs do not enter reads exactly as before (each
    # draws its resamples from its own name), so a new piece of the study leaves the rest alone
    _, _, full = study
    for k, v in full["cells"].items():
        if k != "a100-ib100-resnet50/none/p8":
            assert res["cells"][k] == v, k
    assert res["crossovers"]["a100-ib100-resnet50/typical"] == \
        full["crossovers"]["a100-ib100-resnet50/typical"]
    assert [v for v in res["verdicts"] if v["network"] == "titanx-fdr-resnet18"] == \
        [v for v in full["verdicts"] if v["network"] == "titanx-fdr-resnet18"]


def test_p1s_extra_seeds_run_with_their_cells_not_after_the_authors_rows(study, tmp_path):
    """P1's extra seeds of the tuned A-SGD are sweeps of a cell: they are planned with that cell's
    runs (so it does not stay open until the study's last runs), before the authors' rows."""
    (ready, _), gone = study_without(
        tmp_path, lambda f: (f.name.startswith(f"asgd-p{X.P1_P}-") and "-s3-" in f.name
                             and f.name.endswith("-typical.json") and f.parent.name == "sweep")
        or f.parent.name == "authors" and "-s0" in f.name, read=lambda st: st.plan())
    assert len(gone) > len(X.NETWORKS)
    kinds = [r.kind for r in ready]
    p1 = [i for i, r in enumerate(ready) if r.kind == "sweep" and r.method == "asgd"]
    assert len(p1) == len(X.NETWORKS) and max(p1) < kinds.index("authors"), kinds


def test_an_authors_run_still_to_come_keeps_its_verdicts_so_far(study, tmp_path):
    """An authors' row's extra seed (and P1's) still to come: the verdicts it enters read "so far"
    at that p, not a call from the seeds in so far; the other condition's are untouched."""
    _, _, full = study
    v = lambda res, claim, cond: next(r for r in res["verdicts"]          # noqa: E731
                                      if r["claim"] == claim and r["condition"] == cond)
    assert "so far" not in v(full, "P1 (the authors' form)", "none")["verdict"]
    res, gone = study_without(tmp_path, lambda f: f.name.startswith(f"asgd-authors-p{X.P1_P}-")
                              and f.name.endswith("-s4-titanx-fdr-resnet18-none.json"))
    assert len(gone) == 1
    assert v(res, "P1 (the authors' form)", "none")["verdict"] == v(full, "P1 (the authors' form)", "none")[
        "verdict"] + " so far"
    assert v(res, "P1 (the authors' form)", "stragglers") == v(full, "P1 (the authors' form)", "stragglers")
    # a J1 row's extra seed: its p is "not all in"
    st = X.Study()
    st.plan()
    p, cond, name = next((p, c, n) for p in X.WORKERS for c in X.AUTHORS_CONDITIONS
                         for n in X.AUTHORS_ASYNC if n in st.authors_close(p, c))
    assert p in C.J1_P
    res, gone = study_without(tmp_path / "j1", lambda f: f.name.startswith(f"{name}-p{p}-")
                              and f"-s4-titanx-fdr-resnet18-{cond}.json" in f.name)
    assert len(gone) == 1
    row = v(res, "J1 (the authors' forms)", cond)
    assert f"p = {p}: {C.NOT_ALL_IN}" in row["evidence"] and row["verdict"].endswith("so far"), row
    assert f"p = {p}: {C.NOT_ALL_IN}" not in v(full, "J1 (the authors' forms)", cond)["evidence"]


def test_a_synchronous_run_still_to_come_keeps_every_cell_it_enters_open(study, tmp_path):
    """A synchronous run serves every network's cells (one record, re-timed): while it is still to
    come, each of those cells is open, not only the first network's that asked for it."""
    _, _, full = study
    hit = None
    for key, cell in full["cells"].items():
        for m in ("allreduce", "localsgd"):
            if m in cell["methods"] and 2 in cell["methods"][m]["seeds"]:
                hit = (m, cell["workers"], cell["methods"][m]["config"])
                break
        if hit:
            break
    assert hit, "the model has no synchronous method with extra seeds"
    m, p, c = hit
    cells = [k for k, cl in full["cells"].items() if cl["workers"] == p and m in cl["methods"]
             and cl["methods"][m]["config"] == c and 2 in cl["methods"][m]["seeds"]]
    # (all three extra seeds: no "extra seeds still running" path keeps the cells open)
    names = {f"{m}-p{p}-{c}-s{seed}.json" for seed in X.MORE_SEEDS}
    res, gone = study_without(tmp_path, lambda f: f.parent.name == "sweep" and f.name in names)
    assert len(gone) == len(X.MORE_SEEDS) and res["left"]["ready"] == len(X.MORE_SEEDS)
    assert len({k.split("/")[0] for k in cells}) >= 2, cells        # (the run serves two networks or more)
    for k in cells:
        assert not res["cells"][k]["complete"], k


def said_of(text: str, network: str, condition: str) -> str:
    """What the answer's line for ``condition`` says of ``network``."""
    line = next(x for x in text.splitlines() if x.startswith(f"* **{condition}.**"))
    return line.split(f"`{network}`", 1)[1].split(". ", 1)[0].removeprefix(": ").removesuffix(".")


def test_the_answer_never_reaches_across_a_cell_still_running():
    cell = lambda best, done: dict(fastest=best, tied=[], complete=done)      # noqa: E731
    res = dict(workers=[1, 2, 4, 8], networks=["a"], conditions=["none"], machine_hours_total=1.0,
               cells={"a/none/p2": cell("allreduce", False), "a/none/p4": cell("allreduce", True),
                      "a/none/p8": cell("allreduce", True)})
    text = M.answer_markdown(res, final=False)
    assert said_of(text, "a", "No variability") == \
        "runs still to come at p = 2 · synchronous at p = 4–8 (all-reduce)"
    assert "cells complete yet):" in text                # not "every one through p = 8": p = 2 is open
    res["cells"].update({"a/none/p2": cell("allreduce", True), "a/none/p4": cell("allreduce", False)})
    text = M.answer_markdown(res, final=False)
    assert said_of(text, "a", "No variability") == \
        "synchronous at p = 2 (all-reduce) · runs still to come at p = 4 · synchronous at p = 8 (all-reduce)"
    assert "every one through p = 2)" in text
    del res["cells"]["a/none/p4"]                # a p not begun below one with runs: open too
    assert said_of(M.answer_markdown(res, final=False), "a", "No variability") == \
        "synchronous at p = 2 (all-reduce) · runs still to come at p = 4 · synchronous at p = 8 (all-reduce)"
    del res["cells"]["a/none/p8"]                # past the last p with runs: not said
    assert said_of(M.answer_markdown(res, final=False), "a", "No variability") == \
        "synchronous at p = 2 (all-reduce)"


def test_a_claim_leaves_out_a_cell_still_running(study):
    _, _, res = study
    part = {**res, "cells": {**res["cells"]}}
    k = "a100-ib100-resnet50/none/p8"
    part["cells"][k] = {**res["cells"][k], "complete": False}
    row = C.family_row(part, "J1", "a100-ib100-resnet50", "none", (2, 8), C.ASYNC_SIDE, C.SYNC_SIDE)
    assert f"p = 8: {C.NOT_ALL_IN}" in row["evidence"] and row["verdict"].endswith(" so far")
    full = C.family_row(res, "J1", "a100-ib100-resnet50", "none", (2, 8), C.ASYNC_SIDE, C.SYNC_SIDE)
    assert C.NOT_ALL_IN not in full["evidence"] and "so far" not in full["verdict"]


def test_local_sgd_re_timed_block_shows_each_change_and_the_check(tmp_path):
    """results.md's block on local SGD re-timed (results/crossover-localsgd.json, written by a
    one-off re-timing that git keeps): each cell's new mean against the study's, the calls that
    change, and the check that the code before the fix gives the recorded seconds."""
    import report  # noqa: PLC0415
    seeds = [str(s) for s in range(5)]
    row = lambda base: dict(reached_all=True, mean_seconds=base + 2.0, final_error=0.3,  # noqa: E731
                            seeds={s: dict(seconds=base + int(s), final_error=0.3) for s in seeds})
    rows = {"allreduce": row(100.0), "localsgd": row(110.0)}
    new = {s: 90.0 + int(s) for s in seeds}
    before = dict(fastest="allreduce", tied_set=["allreduce"], family=None)
    after = dict(fastest="localsgd", tied_set=["localsgd"], family=None)
    key = "n/none/p2"
    (tmp_path / "crossover-progress.json").write_text(json.dumps(dict(
        workers=[1, 2], networks=["n"], conditions=["none"], cells={key: dict(methods=rows)})))
    recorded = {s: v["seconds"] for s, v in rows["localsgd"]["seeds"].items()}
    (tmp_path / "crossover-localsgd.json").write_text(json.dumps(dict(
        study_commits=["c" * 40],
        cells={key: dict(recorded=recorded, retimed=new, retimed_code="b" * 40, before=before, after=after,
                         check={**recorded, "4": 0.0}, check_code="a" * 40)})))
    text = report.crossover_localsgd(tmp_path)
    assert "| n | none | 92 (-17.9%) |" in text and \
        "code of bbbbbbb (the study's runs: ccccccc)" in text, text
    assert "1 of 1 cell changes: n/none/p2: fastest all-reduce -> local SGD; " \
           "tied set {all-reduce} -> {local SGD}" in text
    assert "before the fix (aaaaaaa), 4 of 5 seeds' clock-only runs (1 cell) give the study's recorded " \
           "seconds bit for bit" in text


def test_unequal_tuning_counts_are_said_where_they_differ():
    """The edge steps are the one place two methods' tuning runs at a p can differ: said, per p."""
    def t(m, p, runs):
        return {f"{m}/p{p}": dict(method=m, workers=p, runs=runs)}
    even = dict(tuning={**t("single", 1, 8), **t("allreduce", 2, 14), **t("easgd", 2, 14)})
    assert M.tuning_counts_words(even) == "Every method had the same number of tuning runs at every p."
    odd = dict(tuning={**even["tuning"], **t("allreduce", 64, 14), **t("easgd", 64, 16),
                       **t("asgd", 64, 14)})
    text = M.tuning_counts_words(odd)
    assert text.endswith(": p = 64: EASGD 16, every other method 14.") and "p = 2" not in text


def test_packed_records_read_as_the_loose_ones_and_a_pack_loses_nothing(study, tmp_path):
    """store.pack folds each kind's loose records into KIND.jsonl.gz: the study reads the same
    records and plans the same runs from the packs; the same records give the same bytes; a loose
    record written after a pack wins over the packed one of its key; a stray file stops the pack
    before anything is removed."""
    import shutil  # noqa: PLC0415
    part = tmp_path / "results"
    shutil.copytree(X.RESULTS, part)
    loose = store.records(part)
    assert len(loose) == len(study[0].recs) > 100
    counts = store.pack(part)
    assert sum(counts.values()) == len(loose) and not list(part.glob("*/*.json"))
    assert sorted(f.name for f in part.iterdir()) == sorted(f"{k}{store.PACKED}" for k in counts)
    assert store.records(part) == loose
    first = {f.name: f.read_bytes() for f in part.glob(f"*{store.PACKED}")}
    assert store.pack(part) == {} and {f.name: f.read_bytes() for f in part.glob("*.gz")} == first
    mp = pytest.MonkeyPatch()
    mp.setattr(X, "RESULTS", part)
    try:
        again = X.Study()
        assert again.recs == study[0].recs and again.plan() == ([], study[1])
        key = next(k for k in loose if k.startswith("sweep/"))
        store.write(part, key, {**loose[key], "final_error": 0.123})      # a rerun after the pack
        assert X.Study().recs[key]["final_error"] == 0.123
        store.pack(part)
        assert store.records(part)[key]["final_error"] == 0.123 and not list(part.glob("*/*.json"))
        (part / "tune").mkdir()
        (part / "tune" / "stray.json").write_text("{not json")
        with pytest.raises(ValueError, match="not a run record"):
            store.pack(part)
        assert (part / "tune" / "stray.json").exists() and store.records(part)[key]["final_error"] == 0.123
    finally:
        mp.undo()


def test_the_shipped_study_reads_from_its_packs():
    """results/crossover/ ships packed: every record the final analysis counted, from one commit."""
    shipped = X.ROOT / "results" / "crossover"          # (X.RESULTS: the fake study's, while it lives)
    assert not list(shipped.glob("*/*.json")) and list(shipped.glob(f"*{store.PACKED}"))
    recs = store.records(shipped)
    final = json.loads((X.ROOT / "results" / "crossover.json").read_text())
    pin = json.loads((shipped / "pin.json").read_text())["commit"]
    assert len(recs) == final["runs"] and {r["commit"] for r in recs.values()} == {pin}


def test_the_map_reads_p_in_noise_scale_units():
    """A row of 8p / B_noise (and / B_simple in brackets) under each network's table, from the
    study's noise scale; an unresolved fit leaves B_simple alone; neither: no row."""
    res = dict(workers=[1, 2, 128], noise_scale=dict(resolved=True, b_noise=800.0,
                                                     measured=dict(b_simple=400.0)))
    row, text = M.noise_units(res)
    assert row == "| *8p / B_noise (/ B_simple)* | 0.01 (0.02) | 0.02 (0.04) | 1.3 (2.6) |"
    assert "B_noise ≈ 800" in text and "B_simple ≈ 400" in text
    row, text = M.noise_units(dict(res, noise_scale=dict(resolved=False, b_noise=5.0,
                                                         measured=dict(b_simple=400.0))))
    assert row == "| *8p / B_simple* | 0.02 | 0.04 | 2.6 |" and "B_noise" not in text
    assert M.noise_units(dict(res, noise_scale={})) is None


def test_the_pool_runs_what_is_ready_as_records_open_more_and_keeps_to_the_deadline(capsys):
    """run_pool (both studies' pieces): what ready() lists, at most ``jobs`` at a time, read again
    after each finish (a record opens the next run); a run that would end past the deadline waits."""
    done: list = []

    def ready():
        opened = [("a", 1), ("b", 1)] + ([("c", 2)] if ("a", 1) in done else []) \
            + ([("late", 10_000)] if len(done) >= 2 else [])
        return [r for r in opened if r not in done]

    def start(r):
        done.append(r)
        return {"key": r[0]}
    n = D.run_pool(2, 1.0, ready, start, lambda r: r[1], lambda r: r[0], lambda r, rec: rec["key"])
    assert n == 3 and sorted(done) == [("a", 1), ("b", 1), ("c", 2)]
    out = capsys.readouterr().out
    assert out.count("start ") == 3 and out.count("done ") == 3 and "late" not in out
