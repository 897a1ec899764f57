"""``python -m scalesgd plan``: the crossover study's answer for a user's cluster (virtual/plan.py).

A small study file written here stands for the shipped one, so the ranking, the choice of network,
condition and p and the scaling are checked against numbers the test knows; the shipped file is
read as a fresh clone would read it; ``--run`` checks in the virtual cluster."""
import json

import pytest

from helpers import ROOT, run_cli
from synth import make_dataset

from scalesgd.virtual import plan as L
from scalesgd.virtual import profile as P

NETS = ["titanx-fdr-resnet18", "a100-ib100-resnet50", "v100-10gbe-resnet50"]
AR = "--method allreduce --lr 0.05 --linear-scaling --reference-batch 8 --warmup-epochs 0.5"
PS = "--method gossip --gossip push --gossip-overlap --gossip-graph exponential --lr 0.2"
EA = "--method easgd --lr 0.05 --tau 4 --beta 0.9 --servers 4"


def seeds(*times, err=0.39):
    return {str(i): dict(seconds=t, samples=None if t is None else 1e5, final_error=err if t else 0.6)
            for i, t in enumerate(times)}


def row(config, flags, *times):
    ok = None not in times
    return dict(config=config, flags=flags, reached_all=ok, final_error=0.39 if ok else 0.6,
                mean_seconds=sum(times) / len(times) if ok else None, seeds=seeds(*times))


@pytest.fixture
def study(tmp_path):
    """All-reduce fastest on InfiniBand, push-sum on Ethernet (where EASGD missed a seed); under
    stragglers on Ethernet push-sum by more."""
    cells = {}
    for n in NETS:
        for c in ("none", "typical", "stragglers"):
            for p in (2, 8, 64):
                eth = n.startswith("v100")
                slow = 2.0 if c == "stragglers" else 1.0
                methods = {"allreduce": row("L0.05", AR, 10.0 * (3 if eth else 1) * slow, 12.0 * (3 if eth else 1) * slow),
                           "pushsum-ov": row("F0.2", PS, 15.0, 17.0),
                           "easgd": row("F0.05-e4", EA, 40.0, None)}
                fastest = min((m for m in methods if methods[m]["reached_all"]),
                              key=lambda m: methods[m]["mean_seconds"])
                cells[f"{n}/{c}/p{p}"] = dict(fastest=fastest, tied_set=[fastest], methods=methods)
    path = tmp_path / "study.json"
    path.write_text(json.dumps(dict(workers=[1, 2, 8, 64], networks=NETS, conditions=["none", "typical", "stragglers"],
                                    target_error=0.4, complete=True, cells=cells)))
    return path


def test_the_nearest_network_condition_and_p_and_the_scaling(study, tmp_path):
    st = L.load_study(study)
    ib = L.predict(st, P.load("a100-ib100-resnet50"), 8, "typical")
    assert (ib["network"], ib["condition"], ib["p"], ib["scale"]) == ("a100-ib100-resnet50", "typical", 8, 1.0)
    assert [r["method"] for r in ib["rows"]] == ["allreduce", "pushsum-ov", "easgd"]
    assert ib["rows"][0]["mean_seconds"] == pytest.approx(11.0) and ib["rows"][0]["timing"] == "re-timed"
    assert ib["rows"][2]["mean_seconds"] is None and ib["rows"][2]["reached"] == 1   # missed a seed: last
    # a slower GPU on 10 Gbit/s: the Ethernet network, every time x its step's compute over the V100's
    mine = dict(json.loads((ROOT / "src/scalesgd/virtual/profiles/v100-10gbe-resnet50.json").read_text()),
                name="mine", images_per_second=185, link_gbps=4)
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    res = L.predict(st, P.load(str(tmp_path / "mine.json")), 48, "stragglers")
    assert (res["network"], res["p"], res["scale"]) == ("v100-10gbe-resnet50", 64, pytest.approx(2.0))
    assert [r["method"] for r in res["rows"]][:2] == ["pushsum-ov", "allreduce"]
    assert res["rows"][0]["mean_seconds"] == pytest.approx(32.0) and res["rows"][0]["lo"] == pytest.approx(30.0)
    assert any("p = 64, the nearest to your 48" in n for n in res["notes"])
    text = L.show(res, P.load(str(tmp_path / "mine.json")))
    assert "1    pushsum-ov" in text and "fixed rate 0.2, graph exponential" in text
    assert "missed (1/2 seeds; error 60%)" in text and "use: python -m scalesgd " + PS in text
    # a condition the study did not run: its 'typical', said
    odd = L.predict(st, P.load("a100-ib100-resnet50"), 2, str(ROOT / "src/scalesgd/virtual/conditions/typical.json"))
    assert odd["condition"] == "typical" and any("not one the study ran" in n for n in odd["notes"])


def test_plan_from_the_command_line_and_its_errors(study, tmp_path, capsys):
    out = run_cli(["plan", "--profile", "a100-ib100-resnet50", "--workers", "8", "--study", str(study)], tmp_path,
                  module="scalesgd")
    assert out.returncode == 0, out.stderr
    assert "nearest studied network: a100-ib100-resnet50" in out.stdout and "1    allreduce" in out.stdout
    assert L.main(["--profile", "titanx-fdr-resnet18", "--workers", "2", "--study", str(study), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["network"] == "titanx-fdr-resnet18"
    for args, needle in ((["--profile", "cpu-emulated-papers", "--workers", "4"], "a measured profile has no compute"),
                         (["--profile", "nosuch", "--workers", "4"], "nosuch"),
                         (["--profile", "a100-ib100-resnet50", "--workers", "0"], "--workers: at least 1"),
                         (["--profile", "a100-ib100-resnet50", "--workers", "4", "--study", str(tmp_path / "x.json")],
                          "cannot be read")):
        assert L.main(args if "--study" in args else [*args, "--study", str(study)]) != 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
        assert len(err) == 1 and needle in err[0], (args, err)


def test_the_shipped_study_file_plans_for_a_users_profile(tmp_path):
    """What a fresh clone has: the shipped results, a profile file of the user's own."""
    mine = tmp_path / "my-cluster.json"
    mine.write_text(json.dumps({"name": "my-cluster", "description": "A40s on 25 GbE", "images_per_second": 500,
                                "reference": {"model": "resnet50", "image_size": 224},
                                "stands_for": {"model": "resnet50", "image_size": 224, "batch_size": 32},
                                "link_gbps": 20, "latency_us": 10, "ranks_per_node": 1, "intra_gbps": 100,
                                "mem_gbps": 700}))
    out = run_cli(["plan", "--profile", str(mine), "--workers", "64"], tmp_path, module="scalesgd")
    assert out.returncode == 0, out.stderr
    assert "plan: 64 workers on my-cluster" in out.stdout and "nearest studied network" in out.stdout
    st = L.load_study()
    assert set(st["networks"]) == set(NETS) and st["target_error"] == 0.4


def test_run_checks_the_fastest_in_the_virtual_cluster(study, tmp_path, monkeypatch):
    data = make_dataset(tmp_path / "d", n=64, n_val=16, num_classes=10)
    monkeypatch.chdir(tmp_path)
    res = L.predict(L.load_study(study), P.load("a100-ib100-resnet50"), 2, "none")
    checks = L.check(res, "a100-ib100-resnet50", data, top=1)
    assert [c["method"] for c in checks] == ["allreduce"] and checks[0]["predicted"] == pytest.approx(11.0)
    s = json.loads((tmp_path / checks[0]["run_dir"] / "summary.json").read_text())
    assert s["workers"] == 2 and s["virtual"]["profile"]["name"] == "a100-ib100-resnet50"
