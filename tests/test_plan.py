"""``python -m scalesgd plan``: the crossover study's answer for a user's cluster (virtual/plan.py),
and the clock-only virtual runs it times with (virtual/clockonly.py).

The study file here is made from real virtual runs of a tiny task, so its predictions can be held
against the truth: a re-timing (all-reduce) or a full run (pull gossip) under the user's profile.
The shipped file is read as a fresh clone reads it; ``--run`` checks in the virtual cluster."""
import json

import pytest

from helpers import ROOT, TINY, TINY_JOB, run_cli
from synth import make_dataset

from scalesgd.errors import ConfigError
from scalesgd.io import files
from scalesgd.virtual import plan as L
from scalesgd.virtual import profile as P
from scalesgd.virtual import run as VR
from scalesgd.virtual import studyfile as SF

NETS = ["titanx-fdr-resnet18", "a100-ib100-resnet50", "v100-10gbe-resnet50"]
METHODS = {"allreduce": "--method allreduce --lr 0.1",
           "gossip-pull": "--method gossip --gossip pull --lr 0.1",
           "easgd": "--method easgd --lr 0.1 --tau 2 --servers 2"}

# one worker for the module: its module-scoped fixture (runs made once) is built once under -n 2
pytestmark = pytest.mark.xdist_group("plan")


@pytest.fixture(autouse=True)
def clocks_here(monkeypatch):
    """The clock-only runs one after another in the test's process (``plan --jobs``' pool has its own
    test in test_plan_final.py): beside the suite's other worker, a pool only adds its start-up."""
    monkeypatch.setattr(SF, "usable_cores", lambda: 1)


def vrun(data, run_dir, flags, *more):
    assert VR.main([*flags.split(), "--data", str(data), *TINY, "--workers", "2", "--epochs", "2",
                    "--eval-every", "0.25", "--threads", "1", "--run-dir", str(run_dir), *more]) == 0
    rows = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    return [(r["global_samples"], r["train_seconds"], 1 - r["val_top1_accuracy"]) for r in rows
            if r["kind"] == "val"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Real runs under the Ethernet profile (seed 0 and 1) made into a study file; the target is
    the error one of them crosses halfway."""
    tmp = tmp_path_factory.mktemp("plan")
    data = make_dataset(tmp / "d", n=96, n_val=16, num_classes=4)
    runs = {m: {s: vrun(data, tmp / f"{m}-{s}", f, "--seed", str(s), "--profile", "v100-10gbe-resnet50",
                        "--condition", "typical") for s in ((0, 1) if m == "allreduce" else (0,))}
            for m, f in METHODS.items()}
    errs = sorted(e for _, _, e in runs["allreduce"][0])
    target = errs[len(errs) // 2]

    def to(curve):
        return L.to_target([[x, e] for x, _, e in curve], [(x, t) for x, t, _ in curve], target)
    cells = {}
    for c in ("none", "typical", "stragglers"):
        methods = {}
        for m, per in runs.items():
            seeds = {str(s): dict(seconds=to(cv), samples=next((x for x, _, e in cv if e <= target), None),
                                  final_error=cv[-1][2], curve=[[x, e] for x, _, e in cv])
                     for s, cv in per.items()}
            ok = all(v["seconds"] is not None for v in seeds.values())
            methods[m] = dict(config="F0.1", flags=METHODS[m], reached_all=ok, final_error=0.3,
                              mean_seconds=(sum(v["seconds"] for v in seeds.values()) / len(seeds)
                                            if ok else None),
                              seeds=seeds)
        cells[f"v100-10gbe-resnet50/{c}/p2"] = dict(fastest="allreduce", tied_set=["allreduce"],
                                                    methods=methods)
    study = dict(workers=[1, 2], networks=NETS, conditions=["none", "typical", "stragglers"],
                 target_error=target, complete=True, cells=cells,
                 task=dict(job=TINY_JOB, train=96, val=16, classes=4, eval_every=0.25, name="a tiny task"))
    path = tmp / "study.json"
    path.write_text(json.dumps(study))
    return dict(path=path, study=study, runs=runs, data=data, tmp=tmp, target=target, to=to)


def test_a_clock_only_run_has_the_real_runs_clock_bit_for_bit(made):
    """All-reduce: the clock of a run that computes nothing equals the real run's, every validation,
    under another profile and condition than the study's (the re-timing's) too."""
    st = made["study"]
    for s in (0, 1):
        real = made["runs"]["allreduce"][s]
        pts = SF.clock(st, METHODS["allreduce"], 2, P.load("v100-10gbe-resnet50"), P.condition_of(
            P.load("v100-10gbe-resnet50"), "typical"), s, real[-1][0])
        assert pts == [(x, t) for x, t, _ in real]
    # ... and pull gossip's and sharded EASGD's (their timing does not depend on the values either)
    for m in ("gossip-pull", "easgd"):
        real = made["runs"][m][0]
        pts = SF.clock(st, METHODS[m], 2, P.load("v100-10gbe-resnet50"), P.condition_of(
            P.load("v100-10gbe-resnet50"), "typical"), 0, real[-1][0])
        assert pts == [(x, t) for x, t, _ in real], m


def test_plan_is_exact_for_all_reduce_on_the_users_profile(made, tmp_path):
    """A user's slower Ethernet cluster with stragglers: all-reduce's predicted time per seed is the
    re-timing of the real run under that profile and condition, read at the target."""
    mine = dict(json.loads((ROOT / "src/scalesgd/virtual/profiles/v100-10gbe-resnet50.json").read_text()),
                name="mine", images_per_second=185, link_gbps=4)
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    prof = P.load(str(tmp_path / "mine.json"))
    res = L.predict(made["study"], prof, 3, "stragglers")
    assert (res["network"], res["p"], res["condition"]) == ("v100-10gbe-resnet50", 2, "stragglers")
    assert any("p = 2, the nearest to your 3" in n for n in res["notes"])
    row = next(r for r in res["rows"] if r["method"] == "allreduce")
    truth = []
    for s in (0, 1):
        out = made["tmp"] / f"rt-{s}"
        if not out.exists():
            assert VR.main(["retime", str(made["tmp"] / f"allreduce-{s}"),
                            "--profile", str(tmp_path / "mine.json"),
                            "--condition", "stragglers", "--run-dir", str(out)]) == 0
        rows = [json.loads(x) for x in (out / "metrics" / "rank-0.jsonl").read_text().splitlines()]
        truth.append(made["to"]([(r["global_samples"], r["train_seconds"], 1 - r["val_top1_accuracy"])
                                 for r in rows if r["kind"] == "val"]))
    assert row["mean_seconds"] == sum(truth) / 2 and (row["lo"], row["hi"]) == (min(truth), max(truth))
    assert row["timing"] == "exact (re-timed)"
    gossip = next(r for r in res["rows"] if r["method"] == "gossip-pull")
    assert gossip["timing"] == "statistics of v100-10gbe-resnet50 / stragglers"
    text = L.show(res, prof)
    assert "plan: 3 workers on mine" in text and "use: mpirun -n " in text \
        and "python -m scalesgd --method" in text
    assert "add your job's --config or --data and your launcher" in text
    # a method that missed the target is listed as such, and what "missed" means is said once
    lost = dict(res, rows=[*res["rows"][:1],
                           dict(res["rows"][1], mean_seconds=None, reached=1, final_error=0.5)])
    shown = L.show(lost, prof)
    assert f"missed (1/{lost['rows'][1]['seeds']} seeds; error 50%)" in shown
    assert shown.count("missed: not at the target in every seed by the end of the study's runs") == 1
    assert "missed: not at the target" not in text
    far = L.predict(made["study"], prof, 1000, "stragglers")
    assert far["p"] == 2 and any("far beyond the largest p studied (2)" in n for n in far["notes"])
    # while the study runs: a planned p without results there yet gives way to the nearest p with them
    ahead = dict(made["study"], workers=[1, 2, 4], complete=False)
    near = L.predict(ahead, prof, 4, "stragglers")
    assert near["p"] == 2 and near["rows"] and any(
        "p = 4, the study's nearest to your 4 workers, has no results there yet" in n for n in near["notes"])
    assert any("far beyond the largest p studied (2)" in n
               for n in L.predict(ahead, prof, 16, "stragglers")["notes"])
    # ... but never to p = 1 for several workers: a study with results only there has none for them
    single = dict(made["study"],
                  cells={k.replace("/p2", "/p1"): v for k, v in made["study"]["cells"].items()})
    none_yet = L.predict(single, prof, 4, "stragglers")
    assert none_yet["p"] == 2 and none_yet["missing"] and not none_yet["rows"]
    # a cell the study has not run: said, with the p it has there
    gap = L.predict(dict(made["study"], cells={}), prof, 2, "stragglers")
    assert gap["missing"] and "p with results there so far: none" in L.show(gap, prof)
    # a cell whose runs are not all in: said, with what it still waits for
    k = "v100-10gbe-resnet50/stragglers/p2"
    part = dict(made["study"], cells={**made["study"]["cells"],
                                      k: dict(made["study"]["cells"][k], complete=False,
                                              missing=["pushsum-ov"])})
    assert any(f"cell {k} is not complete yet (still to run: pushsum-ov)" in n
               for n in L.predict(part, prof, 2, "stragglers")["notes"])
    assert not any("not complete yet" in n for n in res["notes"])
    # while the study runs, a complete cell says so; an incomplete one says what is missing
    running = dict(made["study"], complete=False)
    assert f"the study is still running, but its cell {k} is complete" in L.show(
        L.predict(running, prof, 2, "stragglers"), prof)
    assert "the study is not complete yet: methods or p it has not run are missing below" in L.show(
        L.predict(dict(part, complete=False), prof, 2, "stragglers"), prof)


def test_a_method_stopped_at_the_cap_is_not_called_missed(made):
    """A study seed that did not reach the target because the study stopped its run at the cap
    (``stopped`` "cap": twice the fastest synchronous time) shows as "stopped at the cap", with its
    own footnote; one that ran its whole horizon ("horizon") as "missed"."""
    prof = P.load("v100-10gbe-resnet50")

    def with_easgd(stopped):
        cells = {}
        for k, cell in made["study"]["cells"].items():
            methods = {m: dict(r, seeds={s: dict(v, stopped="horizon" if v["seconds"] is None else "target")
                                         for s, v in r["seeds"].items()})
                       for m, r in cell["methods"].items()}
            lost = dict(methods["easgd"]["seeds"]["0"], seconds=None, samples=None, final_error=0.55,
                        stopped=stopped)
            methods["easgd"] = dict(methods["easgd"], reached_all=False, mean_seconds=None, final_error=0.55,
                                    seeds={"0": lost})
            cells[k] = dict(cell, methods=methods)
        return dict(made["study"], cells=cells)
    res = L.predict(with_easgd("cap"), prof, 2, "typical")
    row = next(r for r in res["rows"] if r["method"] == "easgd")
    assert row["mean_seconds"] is None and row["stopped_at_cap"] and row["capped"] == 1
    shown = L.show(res, prof)
    assert "stopped at the cap (0/1 seeds; error 55%)" in shown and "missed (" not in shown
    assert shown.count("stopped at the cap: the study stopped the method's runs once it could not be the "
                       "fastest") == 1 and "missed: not at the target" not in shown
    res = L.predict(with_easgd("horizon"), prof, 2, "typical")
    row = next(r for r in res["rows"] if r["method"] == "easgd")
    assert not row["stopped_at_cap"] and row["capped"] == 0
    shown = L.show(res, prof)
    assert "missed (0/1 seeds; error 55%)" in shown and "stopped at the cap" not in shown
    # a study file that says why each seed ended needs no word on the cap under "missed"
    assert "missed: not at the target in every seed by the end of the study's runs, with the mean error " \
           "reached\n" in shown + "\n" and "twice the fastest" not in shown


def test_plan_from_the_command_line_and_its_errors(made, tmp_path, capsys):
    out = run_cli(["plan", "--profile", "v100-10gbe-resnet50", "--workers", "2", "--study", str(made["path"]),
                   "--condition", "typical", "--jobs", "1"], tmp_path, module="scalesgd")
    assert out.returncode == 0, out.stderr
    assert "nearest studied network: v100-10gbe-resnet50" in out.stdout and "timing allreduce" in out.stderr
    steps = tmp_path / "steps.json"      # one step of the job a profile runs with: here the study's task
    steps.write_text(json.dumps({"name": "steps", "step_seconds": 0.2, "link_gbps": 10, "latency_us": 5}))
    for args, needle in ((["--profile", "cpu-emulated-papers", "--workers", "4"], "not a measured step"),
                         (["--profile", str(steps), "--workers", "4"], "not step_seconds"),
                         (["--profile", "nosuch", "--workers", "4"], "nosuch"),
                         (["--profile", "a100-ib100-resnet50", "--workers", "0"], "--workers: at least 1"),
                         (["--profile", "a100-ib100-resnet50", "--workers", "4",
                           "--study", str(tmp_path / "x.json")], "cannot be read")):
        assert L.main(args if "--study" in args else [*args, "--study", str(made["path"])]) != 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
        assert len(err) == 1 and needle in err[0], (args, err)
    # the `scalesgd` command (setup.cfg's entry point) dispatches `plan` as `python -m scalesgd` does
    from scalesgd.__main__ import main as command
    assert "scalesgd = scalesgd.__main__:main" in (ROOT / "setup.cfg").read_text()
    assert command(["plan", "--profile", "nosuch", "--workers", "4", "--study", str(made["path"])]) != 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
    assert len(err) == 1 and "nosuch" in err[0], err
    # a study file whose task is missing, or whose job does not parse, is one line naming it
    study = json.loads(made["path"].read_text())
    for task, needle in ((None, "its 'task' needs the job it ran"),
                         ({**study["task"], "job": "[model]\nmodel = "},
                          "the study's task (its 'task.job'): the job")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**study, "task": task}))
        assert L.main(["--profile", "a100-ib100-resnet50", "--workers", "4", "--study", str(bad)]) != 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
        assert len(err) == 1 and needle in err[0] and "tmp" not in err[0].split("bad.json")[-1], (task, err)


def test_the_shipped_study_file_plans_for_a_users_profile(tmp_path):
    """What a fresh clone has: the shipped results, a profile file of the user's own, the default
    target."""
    mine = tmp_path / "my-cluster.json"
    mine.write_text(json.dumps({"name": "my-cluster", "description": "A40s on 25 GbE",
                                "images_per_second": 500,
                                "reference": {"model": "resnet50", "image_size": 224},
                                "stands_for": {"model": "resnet50", "image_size": 224, "batch_size": 32},
                                "link_gbps": 20, "latency_us": 10, "ranks_per_node": 1, "intra_gbps": 100,
                                "mem_gbps": 700}))
    out = run_cli(["plan", "--profile", str(mine), "--workers", "1", "--jobs", "1"], tmp_path,
                  module="scalesgd", timeout=600)
    assert out.returncode == 0, out.stderr
    assert "plan: 1 worker on my-cluster" in out.stdout and "nearest studied network" in out.stdout
    # the map by time to final quality is the default (test_plan_final.py checks the shipped file);
    # for one worker, which it never ran, the crossover study's early target, said
    assert "note: the map by time to final quality has no runs of one worker (nothing to choose between): " \
        "the ranking is by time to the crossover study's early target" in out.stdout
    assert "time to 40% top-1 error" in out.stdout
    st = L.load_study()
    assert set(st["networks"]) == set(NETS) and st["target_error"] == 0.4 and "job" in st["task"]


def test_run_checks_the_fastest_in_the_virtual_cluster(made, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    res = L.predict(made["study"], P.load("v100-10gbe-resnet50"), 2, "typical")
    checks = L.check(made["study"], res, "v100-10gbe-resnet50", made["data"], top=1, condition="typical")
    assert len(checks) == 1 and checks[0]["predicted"] == res["rows"][0]["mean_seconds"]
    s = json.loads((tmp_path / checks[0]["run_dir"] / "summary.json").read_text())
    assert s["workers"] == 2 and s["virtual"]["profile"]["name"] == "v100-10gbe-resnet50"
    # under the condition the prediction's clocks used (the profile's own is 'none')
    assert s["virtual"]["condition"]["name"] == "typical"
    # the command again, as JSON: the checks join it (stdout stays one JSON document), in new run directories
    capsys.readouterr()
    assert L.main(["--profile", "v100-10gbe-resnet50", "--workers", "2", "--study", str(made["path"]),
                   "--condition", "typical", "--json", "--run", "--data", str(made["data"])]) == 0
    again = json.loads(capsys.readouterr().out)
    assert [c["method"] for c in again["checks"]] == [r["method"] for r in again["rows"]
                                                      if r["mean_seconds"] is not None][:2]
    dirs = {c["run_dir"] for c in again["checks"]}
    assert len(dirs) == 2 and checks[0]["run_dir"] not in dirs
    # a check that cannot run: the prediction is still one JSON document on stdout, the error one line
    assert L.main(["--profile", "v100-10gbe-resnet50", "--workers", "2", "--study", str(made["path"]),
                   "--condition", "typical", "--json", "--run", "--data", str(tmp_path / "nowhere")]) == 2
    out = capsys.readouterr()
    assert "checks" not in json.loads(out.out) and "no data set there" in out.err
    # the same method checked again within the second: a directory of its own (a second no run above
    # can have fallen in, so the names do not depend on when the runs above started)
    frozen = "20000101-000000"
    monkeypatch.setattr(files.time, "strftime", lambda fmt: frozen)
    twice = [L.check(made["study"], res, "v100-10gbe-resnet50", made["data"], top=1)[0]["run_dir"]
             for _ in range(2)]
    base = f"runs/{frozen}-plan-{checks[0]['method']}-p2"
    assert twice == [base, base + ".2"], twice


def test_the_balance_is_at_the_bandwidth_each_rank_gets(made):
    """A node's ranks share its link: 8 GPUs a node on a link leave each rank an eighth of it, so the
    ratio of communication to compute is (nearly) 8 times one GPU a node's, and plan matches the
    studied network by it (it said 1.18 for both before, which the study's flat methods and the
    clock-only runs, sharing the link, do not see)."""
    import dataclasses
    one = P.load("v100-10gbe-resnet50")
    eight = dataclasses.replace(one, ranks_per_node=8)
    a, b = L.balance(one, made["study"]), L.balance(eight, made["study"])
    assert a["step_seconds"] == b["step_seconds"]
    lat = one.latency_us * 1e-6
    assert b["comm_seconds"] - lat == pytest.approx(8 * (a["comm_seconds"] - lat), rel=1e-12)
    assert b["ratio"] > 7 * a["ratio"]
    # as node agents (--hierarchy node) each node has the whole link, and sums inside itself first
    c = L.balance(eight, made["study"], agents="node")
    nbytes = (a["comm_seconds"] - lat) * one.link_gbps * 1e9 / 8
    assert c["comm_seconds"] == pytest.approx(lat + nbytes / (one.link_gbps * 1e9 / 8)
                                              + 2 * nbytes / (one.intra_gbps * 1e9 / 8), rel=1e-9)
    assert a["ratio"] < c["ratio"] < b["ratio"] / 7


def test_plan_times_node_agents_on_a_profile_of_several_gpus_a_node(made, tmp_path):
    """2 GPUs a node on a slow link, 4 workers: every method is timed flat and as node agents
    (its flags with --hierarchy node, on a clock-only run of them); the node agents' all-reduce is
    exact (the study's errors on the two-level sum's clock), pull gossip's node agents take the flat
    runs' samples on their own clock (not the flat one's); the use: line carries the hierarchy when
    a node-agent row is first."""
    import dataclasses
    st = dict(made["study"], workers=[1, 2, 4],
              cells={k.replace("/p2", "/p4"): v for k, v in made["study"]["cells"].items()})
    prof = dataclasses.replace(P.load("v100-10gbe-resnet50"), name="slow-pairs", ranks_per_node=2,
                               link_gbps=0.05)
    res = L.predict(st, prof, 4, "typical")
    assert res["node_agents"]["nodes"] == 2 and res["ranks_per_node"] == 2
    rows = {(r["method"], r["agents"]): r for r in res["rows"]}
    assert set(rows) == {(m, a) for m in METHODS for a in ("rank", "node")}
    ar = rows["allreduce", "node"]
    assert ar["flags"].endswith("--hierarchy node") and ar["timing"] == "exact (re-timed)"
    assert "hierarchy node" in ar["settings"] and "hierarchy" not in rows["allreduce", "rank"]["settings"]
    yours = P.condition_of(prof, "typical")
    truth = []
    for sd, v in st["cells"]["v100-10gbe-resnet50/typical/p4"]["methods"]["allreduce"]["seeds"].items():
        pts = SF.clock(st, METHODS["allreduce"] + " --hierarchy node", 4, prof, yours, int(sd),
                      v["curve"][-1][0])
        truth.append(L.to_target(v["curve"], pts, st["target_error"]))
    assert ar["mean_seconds"] == pytest.approx(sum(truth) / len(truth), rel=1e-12)
    g, gflat = rows["gossip-pull", "node"], rows["gossip-pull", "rank"]
    seeds = st["cells"]["v100-10gbe-resnet50/typical/p4"]["methods"]["gossip-pull"]["seeds"]
    need = [v["samples"] for v in seeds.values()]
    pts = SF.clock(st, METHODS["gossip-pull"] + " --hierarchy node", 4, prof, yours, int(next(iter(seeds))),
                  max(need))
    assert g["mean_seconds"] == pytest.approx(sum(L.at(pts, x) for x in need) / len(need), rel=1e-12)
    assert g["mean_seconds"] != pytest.approx(gflat["mean_seconds"], rel=1e-3)
    assert "statistics of" in rows["gossip-pull", "node"]["timing"] and "flat" in rows["gossip-pull", "node"][
        "timing"]
    assert any("timed both flat (one agent a rank" in n for n in res["notes"])
    # its ratio is far outside the studied ones because its ranks share the link (it has stands_for)
    assert any("ranks a node share its link" in n for n in res["notes"])
    assert not any("without stands_for" in n for n in res["notes"])
    first = next(r for r in res["rows"] if r["mean_seconds"] is not None)
    text = L.show(res, prof)
    assert "method (agents)" in text and "as node agents (2 nodes of 2)" in text
    use = next(ln for ln in text.splitlines() if ln.strip().startswith("use:"))
    assert (("--hierarchy node" in use) == (first["agents"] == "node")), (use, first)
    forced = dict(res, rows=[ar, *[r for r in res["rows"] if r is not ar]])
    use = next(ln for ln in L.show(forced, prof).splitlines() if ln.strip().startswith("use:"))
    assert "--method allreduce" in use and use.count("--hierarchy node") == 1 and "keep each node's 2" in use
    # the fastest method's other form is not marked as tied with it
    shown = L.show(dict(forced, rows=[dict(r, tied=True) for r in forced["rows"]]), prof).splitlines()
    assert not any("allreduce (rank)" in ln and "tied with the fastest" in ln for ln in shown)
    others = [f"{r['method']} ({r['agents']})" for r in forced["rows"]
              if r["method"] != "allreduce" and r["mean_seconds"] is not None]
    assert all(any(o in ln and "tied with the fastest" in ln for ln in shown) for o in others)
    # fewer than two nodes at p: flat only, said
    alone = L.predict(made["study"], dataclasses.replace(prof, ranks_per_node=2), 2, "typical")
    assert alone["node_agents"] is None and {r["agents"] for r in alone["rows"]} == {"rank"}
    assert any("fewer than two nodes" in n for n in alone["notes"])
    # two nodes or more, but not whole ones (p = 5 on nodes of 2): flat only, said, no crash
    st5 = dict(st, workers=[1, 2, 5], cells={"v100-10gbe-resnet50/typical/p5": dict(methods={})})
    odd = L.predict(st5, prof, 5, "typical")
    assert odd["p"] == 5 and odd["node_agents"] is None and odd["rows"] == []
    assert any("at p = 5 there are no whole nodes" in n for n in odd["notes"])


def test_plan_times_to_another_target_read_from_the_same_runs(made):
    """--target ERR at or above the study's own: every time is read from the same validations
    (all-reduce's re-timed, the asynchronous methods' samples to ERR on their clock), no tie is
    marked; below the study's target, or 'final' (the map's file, not this one): refused."""
    st, prof = made["study"], P.load("v100-10gbe-resnet50")
    own = L.predict(st, prof, 2, "typical")
    assert L.predict(st, prof, 2, "typical", target=str(st["target_error"]))["rows"] == own["rows"]
    errs = sorted({e for c in made["runs"]["allreduce"].values() for _, _, e in c})
    higher = next(e for e in reversed(errs) if e > st["target_error"] + 0.05)
    res = L.predict(st, prof, 2, "typical", target=higher)
    assert res["target_error"] == higher and res["study_target"] == st["target_error"]
    assert any("not the study's own target" in n for n in res["notes"])
    assert not any(r["tied"] for r in res["rows"])
    rows = {r["method"]: r for r in res["rows"]}
    cell = st["cells"]["v100-10gbe-resnet50/typical/p2"]["methods"]
    yours = P.condition_of(prof, "typical")
    truth = []
    for sd, v in cell["allreduce"]["seeds"].items():
        pts = SF.clock(st, METHODS["allreduce"], 2, prof, yours, int(sd), v["curve"][-1][0])
        truth.append(L.to_target(v["curve"], pts, higher))
    assert rows["allreduce"]["mean_seconds"] == pytest.approx(sum(truth) / 2, rel=1e-12)
    before = {r["method"]: r for r in own["rows"]}
    assert rows["allreduce"]["mean_seconds"] <= before["allreduce"]["mean_seconds"]
    g = cell["gossip-pull"]["seeds"]["0"]
    x = L.samples_to(g["curve"], higher)
    assert x is not None and x <= g["curve"][-1][0]
    pts = SF.clock(st, METHODS["gossip-pull"], 2, prof, yours, 0, x)
    assert rows["gossip-pull"]["mean_seconds"] == pytest.approx(L.at(pts, x), rel=1e-12)
    # the study's own samples are this reading at its own target
    assert L.samples_to(g["curve"], st["target_error"]) == g["samples"]
    for spec, needle in (("final", "read from the map by time to final quality"),
                         (st["target_error"] / 2, "stop at its target"),
                         ("1.5", "between 0 and 1"), ("x", "'final' or a top-1 error")):
        with pytest.raises(ConfigError, match=needle):
            L.predict(st, prof, 2, "typical", target=spec)
