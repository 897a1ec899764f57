"""``python -m scalesgd plan`` by time to final quality (virtual/planfinal.py), the default target.

The map's file here is made from real virtual runs of a tiny task over a cosine schedule, as
``benchmarks/final_map.py`` ships its own: a flat cell (one GPU a node) and a cell of node agents
on a profile of two GPUs a node.  The predictions are held against the truth: the re-timing of the
real all-reduce runs under the user's profile.  The shipped file is read as a fresh clone reads it."""
import json

import pytest

from helpers import ROOT, TINY, TINY_JOB
from synth import make_dataset

from scalesgd.errors import ConfigError
from scalesgd.virtual import plan as L
from scalesgd.virtual import planfinal as F
from scalesgd.virtual import profile as P
from scalesgd.virtual import run as VR
from scalesgd.virtual import studyfile as SF

pytestmark = pytest.mark.xdist_group("planfinal")


@pytest.fixture(autouse=True)
def clocks_here(monkeypatch):
    """The clock-only runs one after another in the test's process (``plan --jobs``' pool has its own
    test in test_plan_final.py): beside the suite's other worker, a pool only adds its start-up."""
    monkeypatch.setattr(SF, "usable_cores", lambda: 1)

FLAT = "v100-10gbe-resnet50"
NODE = "v100x8-10gbe-resnet50"
SCHEDULE = "--schedule cosine --warmup-epochs 0.5"
METHODS = {"allreduce": "--method allreduce --lr 0.1",
           "localsgd": "--method localsgd --lr 0.1 --tau 2",
           "pushsum-ov": "--method gossip --gossip push --gossip-overlap --lr 0.1"}
SEEDS = (0, 1)
P16 = 16


def curve_of(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    return [(r["global_samples"], r["train_seconds"], 1 - r["val_top1_accuracy"]) for r in rows
            if r["kind"] == "val"]


def vrun(data, run_dir, flags, p, profile, condition, seed):
    assert VR.main([*flags.split(), "--data", str(data), *TINY, "--workers", str(p), "--epochs", "2",
                    "--eval-every", "0.5", "--threads", "1", "--profile", profile, "--condition", condition,
                    "--seed", str(seed), "--run-dir", str(run_dir)]) == 0
    return curve_of(run_dir)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The map's file from real runs at p = 16, two seeds a method, flat on the Ethernet profile and
    as node agents on its form of eight GPUs a node (two nodes).  As in the map, the synchronous
    methods' cells hold the same errors under every condition (here run under 'typical'), and
    push-sum ran under 'none' only: the 'typical' cells have no push-sum."""
    tmp = tmp_path_factory.mktemp("planfinal")
    data = make_dataset(tmp / "d", n=256, n_val=16, num_classes=4)
    runs, cells = {}, {}
    for net, ag in ((FLAT, "flat"), (NODE, "node")):
        by = {"typical": {}, "none": {}}
        for m, f in METHODS.items():
            flags = f"{f} {SCHEDULE}" + (" --hierarchy node" if ag == "node" else "")
            cond = "typical" if m in L.SYNC else "none"
            per = {s: vrun(data, tmp / f"{ag}-{m}-{s}", flags, P16, net, cond, s) for s in SEEDS}
            runs[ag, m] = per
            fe = sum(c[-1][2] for c in per.values()) / len(per)
            row = dict(config="L0.1", flags=flags, final_error=fe,
                       seeds={str(s): dict(final_error=c[-1][2], curve=[[x, e] for x, _, e in c])
                              for s, c in per.items()})
            for c in (("typical", "none") if m in L.SYNC else ("none",)):
                by[c][m] = row
        for c, methods in by.items():
            fs = min(methods[m]["final_error"] for m in ("allreduce", "localsgd"))
            cells[f"{net}/{c}/p{P16}"] = dict(agents=ag, fstar=fs, quality=fs + 0.01, call="tie",
                                              complete=True, missing=[], methods=methods)
    study = dict(metric="final", E=2, delta=0.01, target_error=0.4, workers=[P16],
                 p=dict(flat=[P16], node=[P16]), networks=[FLAT, NODE], agents={FLAT: "flat", NODE: "node"},
                 conditions=["none", "typical"], complete=True, cells=cells,
                 task=dict(job=TINY_JOB, train=256, val=16, classes=4, eval_every=0.5, name="a tiny task",
                           schedule="cosine over 2 epochs"))
    path = tmp / "final.json"
    path.write_text(json.dumps(study))
    return dict(path=path, study=study, runs=runs, data=data, tmp=tmp)


def mine(tmp_path, **over):
    """A user's profile unlike the shipped ones (slower Ethernet, another GPU speed)."""
    d = dict(json.loads((ROOT / f"src/scalesgd/virtual/profiles/{FLAT}.json").read_text()),
             name="mine", images_per_second=185, link_gbps=4, **over)
    path = tmp_path / f"mine-{len(over)}.json"
    path.write_text(json.dumps(d))
    return path


def retimed(made, ag, m, prof_path, condition):
    """The truth: each seed's real run re-timed under the user's profile and condition."""
    out = []
    for s in SEEDS:
        to = made["tmp"] / f"rt-{ag}-{m}-{s}-{prof_path.stem}-{condition}"
        if not to.exists():
            assert VR.main(["retime", str(made["tmp"] / f"{ag}-{m}-{s}"), "--profile", str(prof_path),
                            "--condition", condition, "--run-dir", str(to)]) == 0
        out.append([(t, e) for _, t, e in curve_of(to)])
    return out


def test_all_reduce_is_timed_exactly_to_final_quality_on_the_users_profile(made, tmp_path):
    """The flat cell on a user's slower Ethernet under 'typical': all-reduce's and local SGD's times
    to F* + δ are their seeds' re-timed mean curves read at the quality, as the map reads its cells;
    F* is the least synchronous final error; push-sum, which the map ran under 'none' only, comes
    from there (said) on the user's clock; every row has its final error and whole schedule."""
    path = mine(tmp_path)
    prof = P.load(str(path))
    res = F.predict_final(made["study"], prof, 12, "stragglers")
    # the user's condition is not one the file holds: said, no cell there
    assert res == (f"the map by time to final quality has no results for your network ({FLAT}, the "
                   "nearest) and condition (stragglers) yet")
    assert "no runs of one worker" in F.predict_final(made["study"], prof, 1, "typical")
    res = F.predict_final(made["study"], prof, 12, "typical")
    assert (res["network"], res["p"], res["condition"]) == (FLAT, P16, "typical")
    assert any("the map ran p = 16, the nearest to your 12" in n for n in res["notes"])
    fs = min(made["study"]["cells"][f"{FLAT}/typical/p16"]["methods"][m]["final_error"]
             for m in ("allreduce", "localsgd"))
    assert res["fstar"] == fs and res["quality"] == fs + 0.01
    for m in ("allreduce", "localsgd"):
        row = next(r for r in res["rows"] if r["method"] == m)
        truth = retimed(made, "flat", m, path, "typical")
        mean = F.mean_curve(truth)
        assert row["to_quality"] == F.first(mean, res["quality"]) and row["end"] == mean[-1][0]
        assert row["timing"] == "exact (re-timed)"
        per = [F.first(t, res["quality"]) for t in truth]
        assert row["reached"] == sum(t is not None for t in per)
    push = next(r for r in res["rows"] if r["method"] == "pushsum-ov")
    assert push["timing"] == f"statistics of {FLAT} / typical"
    assert any("pushsum-ov ran under none and stragglers only: its statistics under typical are those of "
               f"none on {FLAT}" in n for n in res["notes"])
    # push-sum's time: its seeds' samples on one seed's clock-only run under the user's profile
    pts = SF.clock(made["study"], push["flags"], P16, prof, P.condition_of(prof, "typical"), 0,
                  made["runs"]["flat", "pushsum-ov"][0][-1][0])
    mean = F.mean_curve([[(F.at(pts, x), e) for x, _, e in c]
                         for c in made["runs"]["flat", "pushsum-ov"].values()])
    assert push["to_quality"] == F.first(mean, res["quality"]) and push["end"] == mean[-1][0]
    ranked = [r["to_quality"] for r in res["rows"] if r["to_quality"] is not None]
    assert ranked == sorted(ranked) and ranked
    text = F.show_final(res, prof)
    assert f"time to final quality (within 1 point of the best synchronous final error, {fs:.2%}" in text
    assert "its gaps between methods overstate those of longer schedules" in text
    assert "use: mpirun -n 12 python -m scalesgd --method" in text and "--epochs N" in text
    assert "--schedule cosine" in text


def test_a_method_that_misses_the_quality_is_ranked_last_with_its_gap(made, tmp_path):
    """Push-sum ending 30 points worse: ranked after every method that reaches the quality, with its
    final error, its whole schedule and that against the fastest synchronous method's time to the
    same error ('1.8x faster, 2 points worse' is an answer a user can choose)."""
    st = json.loads(json.dumps(made["study"]))
    ps = st["cells"][f"{FLAT}/none/p16"]["methods"]["pushsum-ov"]
    for v in ps["seeds"].values():
        v["curve"] = [[x, min(0.95, e + 0.3)] for x, e in v["curve"]]
        v["final_error"] = v["curve"][-1][1]
    ps["final_error"] = sum(v["final_error"] for v in ps["seeds"].values()) / 2
    # the synchronous methods reach every error down to their own (here: below push-sum's)
    prof = P.load(str(mine(tmp_path)))
    res = F.predict_final(st, prof, 16, "none")
    row = res["rows"][-1]
    assert row["method"] == "pushsum-ov" and row["to_quality"] is None and row["reached"] == 0
    best = min((r for r in res["rows"] if r["method"] != "pushsum-ov"), key=lambda r: r["to_quality"])
    assert row["gap"] == pytest.approx(row["final_error"] - best["final_error"])
    assert row["vs"]["method"] == best["method"] and row["vs"]["seconds"] is not None
    assert row["vs"]["ratio"] == pytest.approx(row["end"] / row["vs"]["seconds"])
    text = F.show_final(res, prof)
    assert f"misses: {row['gap'] * 100:+.1f} points; {row['vs']['ratio']:.2f}x the time {best['method']} " \
        "takes to that error" in text


def test_a_users_cluster_of_eight_gpus_a_node_gets_node_agents_and_the_extrapolation(made, tmp_path):
    """A user's 256 GPUs, 8 a node, on 10 GbE, standing for ResNet-50 (a profile unlike the shipped
    ones): flat and node-agent rows at the same p on the user's clock, the node agents' settings
    carry --hierarchy node, the node rows' statistics are the node network's (exact for both
    synchronous methods in nodes of 8, as the map's), and the map's p far below 256 is named an
    extrapolation."""
    path = mine(tmp_path, ranks_per_node=8, intra_gbps=600)
    prof = P.load(str(path))
    res = F.predict_final(made["study"], prof, 256, "typical")
    node = [r for r in res["rows"] if r["agents"] == "node"]
    flat = [r for r in res["rows"] if r["agents"] == "rank"]
    assert len(node) == len(flat) == 3 and {r["p"] for r in res["rows"]} == {P16}
    assert all("--hierarchy node" in r["flags"] and "hierarchy node" in r["settings"] for r in node)
    assert all("--hierarchy" not in r["flags"] for r in flat)
    assert res["node_agents"]["network"] == NODE
    assert (res["node_agents"]["nodes"], res["node_agents"]["your_nodes"]) == (2, 32)
    assert sum("far beyond the largest p the map has" in n for n in res["notes"]) == 1
    # the node agents' balance is the whole link and the node's own sum, the flat ranks' an eighth of it
    assert res["node_agents"]["ratio"] < res["ratio"]
    # the node rows' synchronous methods are timed exactly: the re-timing of their real node-agent runs
    for m in ("allreduce", "localsgd"):
        truth = F.mean_curve(retimed(made, "node", m, path, "typical"))
        row = next(r for r in node if r["method"] == m)
        assert row["to_quality"] == F.first(truth, res["quality"]) and row["timing"].startswith("exact")
    text = F.show_final(res, prof)
    assert "as node agents (at p = 16: 2 of your nodes of 8; you have 32)" in text
    assert "method (agents)" in text
    # a row that misses is put against the first synchronous row, named with its agents (both forms
    # of a method are rows here)
    first, other = res["rows"][0], res["rows"][1]
    missed = dict(other, to_quality=None, gap=0.1, vs=dict(method=first["method"], agents=first["agents"],
                                                            seconds=1.0, ratio=1.99))
    shown = F.show_final(dict(res, rows=[first, missed]), prof)
    assert f"misses: +10.0 points; 1.99x the time {first['method']} ({first['agents']}) takes to that error" \
        in shown
    best = dict(res["rows"][0], agents="node", flags=node[0]["flags"], to_quality=1.0)
    first = F.show_final(dict(res, rows=[best]), prof)
    assert "use: mpirun -n 256 python -m scalesgd " + node[0]["flags"] in first
    assert "node agents: keep each node's 8 ranks together" in first


def test_node_agents_need_whole_nodes_and_say_what_is_not_exact(made, tmp_path):
    """Nodes of 6 do not divide the map's p = 16: only flat agents, said (the node-agent run would be
    refused).  Nodes of 2: node agents in 8 of the user's nodes, all-reduce exact, local SGD (8
    replicas, not the map's 2) the map's statistics, said."""
    six = P.load(str(mine(tmp_path, ranks_per_node=6)))
    res = F.predict_final(made["study"], six, 32, "typical")
    assert res["node_agents"] is None and {r["agents"] for r in res["rows"]} == {"rank"}
    assert any("p = 16 is not a whole number of your nodes of 6" in n for n in res["notes"])
    two = P.load(str(mine(tmp_path, ranks_per_node=2, intra_gbps=600)))
    res = F.predict_final(made["study"], two, 16, "typical")
    rows = {(r["method"], r["agents"]): r for r in res["rows"]}
    assert rows["allreduce", "node"]["timing"] == "exact (re-timed), node agents"
    assert rows["localsgd", "node"]["timing"] == f"statistics of {NODE} / typical, node agents"
    assert any("exact for all-reduce only, your nodes holding 2" in n for n in res["notes"])
    assert res["node_agents"]["nodes"] == 8


def test_plan_final_from_the_command_line_and_its_errors(made, tmp_path, capsys):
    """The default target is final quality (a --study file's own metric); a target error with the
    map's file, or 'final' with the crossover study's, is refused naming why; a cell the map lacks,
    asked for with its file, is refused naming the early target."""
    path = mine(tmp_path)
    assert L.main(["--profile", str(path), "--workers", "16", "--condition", "typical",
                   "--study", str(made["path"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metric"] == "final" and out["rows"] and out["quality"] > out["fstar"]
    assert L.main(["--profile", str(path), "--workers", "16", "--condition", "typical",
                   "--study", str(made["path"]), "--target", "0.5"]) == 2
    assert "holds no times to an error of your choosing" in capsys.readouterr().err
    assert L.main(["--profile", str(path), "--workers", "16", "--study", str(L.STUDY),
                   "--target", "final"]) == 2
    assert "an early-target study (time to 0.4 error); --target final needs the map's file" in \
        capsys.readouterr().err
    with pytest.raises(ConfigError, match="time to final quality is read from the map"):
        L.target_of(dict(target_error=0.4), "final")
    assert L.main(["--profile", str(path), "--workers", "16", "--condition", "stragglers",
                   "--study", str(made["path"])]) == 2
    assert "and condition (stragglers) yet; the crossover study's early target instead: --target 0.4 " \
        "without --study" in capsys.readouterr().err


def test_clock_only_runs_in_processes_of_their_own_are_those_run_here(made):
    """``plan --jobs``: the clock-only runs spread over processes give each seed's clock, in order,
    exactly as one after another in this process; --jobs below 1 is refused."""
    study, prof = made["study"], P.load(FLAT)
    cond = P.condition_of(prof, "typical")
    flags = study["cells"][f"{FLAT}/typical/p{P16}"]["methods"]["allreduce"]["flags"]
    jobs = [(flags, P16, s, 512) for s in SEEDS]
    here = SF.clocks(study, prof, cond, jobs, procs=1)
    assert SF.clocks(study, prof, cond, jobs, procs=2) == here
    assert here[0] != here[1] and [x for x, _ in here[0]] == [128.0, 256.0, 384.0, 512.0]
    with pytest.raises(SystemExit) as e:
        L.main(["--profile", FLAT, "--workers", "16", "--jobs", "0"])
    assert e.value.code == 2


def test_the_shipped_map_file_is_the_final_quality_one():
    """A fresh clone's map by time to final quality, which ``plan`` reads by default (its run from
    the command line for a user's profile: test_plan.py, test_the_shipped_study_file_plans_...)."""
    shipped = json.loads(F.FINAL.read_text())
    assert shipped["metric"] == "final" and set(shipped["agents"].values()) == {"flat", "node"}
    assert set(shipped["p"]) == {"flat", "node"} and shipped["E"] >= 8


def test_run_checks_the_fastest_over_the_whole_schedule(made, tmp_path, monkeypatch):
    """--run: the fastest predicted methods run the map's whole schedule in the virtual cluster under
    the user's profile and the prediction's condition, at their p; all-reduce's measured time to the
    quality is its seed-0 real run's re-timing read there, exactly."""
    path = mine(tmp_path)
    prof = P.load(str(path))
    res = F.predict_final(made["study"], prof, 16, "typical")
    ar = next(r for r in res["rows"] if r["method"] == "allreduce")
    monkeypatch.chdir(tmp_path)
    got = F.check_final(made["study"], dict(res, rows=[ar]), str(path), made["data"], top=1,
                        condition="typical")
    assert len(got) == 1 and got[0]["method"] == "allreduce" and got[0]["predicted"] == ar["to_quality"]
    s = json.loads((tmp_path / got[0]["run_dir"] / "summary.json").read_text())
    assert s["workers"] == P16 and s["virtual"]["condition"]["name"] == "typical"
    seed0 = retimed(made, "flat", "allreduce", path, "typical")[0]
    assert got[0]["measured"] == F.first(seed0, res["quality"])


def test_a_map_without_push_sum_there_yet_says_so(made, tmp_path):
    """While the map runs, a 'typical' cell can be complete (its synchronous methods) before push-sum
    has run under 'none' at that p: the rows are the synchronous ones, and a note says why."""
    st = dict(made["study"], cells={k: v for k, v in made["study"]["cells"].items() if "/none/" not in k})
    res = F.predict_final(st, P.load(str(mine(tmp_path))), 16, "typical")
    assert {r["method"] for r in res["rows"]} == {"allreduce", "localsgd"}
    assert any(f"push-sum has no results on {FLAT} at p = 16 yet" in n for n in res["notes"])


def test_how_sure_the_first_place_is_comes_from_resampling_the_seeds():
    """``first_share``: F*, the mean curves and their times redone in every resample of the paired
    seeds.  A method quicker and better in every seed is first in every resample; one whose mean
    final error sits on the quality, some seeds above and some below, only in some; one that reaches
    no quality is never first."""
    def run(end_error, step=1.0):                 # 4 validations, the error falling to end_error
        return [(k * 100, k * step, 0.6 - k * (0.6 - end_error) / 4) for k in range(1, 5)]
    fast = dict(method="localsgd", runs=[run(0.170 + 0.002 * s, step=0.5) for s in range(5)])
    slow = dict(method="allreduce", runs=[run(0.171 + 0.002 * s) for s in range(5)])
    assert F.first_share([fast, slow], 0.01) == 1.0
    # on the edge: local SGD's mean final error equal to F* + 1 point, its seeds 2 points either side
    edge = dict(method="localsgd", runs=[run(e, step=0.5) for e in (0.165, 0.205, 0.165, 0.205, 0.185)])
    ar = dict(method="allreduce", runs=[run(0.175) for _ in range(5)])
    share = F.first_share([edge, ar], 0.01)
    assert 0.2 < share < 0.8
    assert F.first_share([edge, ar], 0.01, seed=1) != share            # the resamples are drawn
    never = dict(method="pushsum-ov", runs=[run(0.4, step=0.1) for _ in range(5)])
    assert F.first_share([never, ar], 0.01) == 0.0 and F.first_share([ar], 0.01) is None


def test_the_answer_says_how_sure_its_first_place_is(made, tmp_path):
    prof = P.load(str(mine(tmp_path)))
    res = F.predict_final(made["study"], prof, 16, "typical")
    assert 0.0 <= res["first_share"] <= 1.0 and res["resamples"] == F.RESAMPLES
    text = F.show_final(res, prof)
    first = res["rows"][0]["method"]
    assert f"  sure: {first} is first in {res['first_share']:.0%} of {F.RESAMPLES} resamples" in text
    unsure = F.show_final(dict(res, first_share=0.51), prof)
    assert "is first in 51% of" in unsure and "not told apart from the next by the map's seeds" in unsure
