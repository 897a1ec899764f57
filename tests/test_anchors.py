"""``benchmarks/anchors.py``: every published row's cluster is a valid profile, a row's prediction
is a clock-only virtual run read as seconds per iteration, and the derived published figures are
the sources' arithmetic."""
import json

import pytest

import anchors as A


def test_the_published_figures_derived_from_wall_clock_times():
    # Goyal et al.: 90 epochs of ImageNet at 8192 in one hour: 14,075 iterations
    assert A.per_iteration(1.0, 90, 8192) == pytest.approx(3600 / (90 * 1_281_167 / 8192))
    assert 0.2557 < A.per_iteration(1.0, 90, 8192) < 0.2559
    assert A.per_iteration(0.25, 90, 32768) == pytest.approx(A.per_iteration(1.0, 90, 8192))


def test_every_row_names_a_cluster_that_loads_as_a_profile(tmp_path):
    assert len({r["key"] for r in A.ROWS}) == len(A.ROWS)
    for name in {r["cluster"] for r in A.ROWS}:
        prof = A.profile(name, tmp_path)
        assert prof.stands_for["model"] in ("resnet50", "resnet101") and prof.ranks_per_node in (4, 8), name
        assert prof.stands_for["model"] == prof.reference["model"], name   # the step: the source's own
        assert prof.compute_source                     # where the GPU's speed comes from, said
    comparable = [r for r in A.ROWS if r["comparable"]]
    assert len(comparable) >= 6 and {r["network"] for r in comparable} >= {"10 GbE", "2 x FDR InfiniBand",
                                                                            "40 GbE"}
    methods = " ".join(r["flags"] for r in A.ROWS)
    assert all(f"--method {m}" in methods for m in ("allreduce", "gossip", "localsgd", "asgd"))


def test_a_row_is_predicted_by_a_clock_only_run(tmp_path):
    out = tmp_path / "anchors.json"
    assert A.main(["--only", "goyal-allreduce", "--steps", "3", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    (row,) = d["rows"]
    assert row["key"] == "goyal-allreduce" and row["steps"] == 3 and row["gpus"] == 256
    sp = row["split_per_step"]
    # the profile's step: Goyal et al.'s 8-GPU baseline, 90 epochs of 256 images in 29 hours
    assert sp["compute"] == pytest.approx(29 * 3600 / (90 * 1_281_167 / 256), rel=1e-3)
    assert row["predicted"] >= sp["compute"] + sp["comm"] > sp["compute"]
    assert row["ratio"] == pytest.approx(row["predicted"] / row["published"])
    assert row["implied_compute"] == pytest.approx(row["published"] - sp["comm"] - sp["wait"])
    assert row["goal_met"] is (abs(row["ratio"] - 1) <= A.GOAL)
    with pytest.raises(SystemExit):
        A.main(["--only", "no-such-row", "--json", str(out)])


def test_a_parameter_server_row_splits_a_workers_step_from_its_exchanges(tmp_path):
    """Rank 0 of a server method serves and computes nothing: the row's split is a worker's step
    (the profile's: Horovod's one-GPU ResNet-101 at 64 images) and the rest of the iteration."""
    out = tmp_path / "anchors.json"
    assert A.main(["--only", "tf-ps-16", "--steps", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    sp = row["split_per_step"]
    assert sp["compute"] == pytest.approx(64 / 119.4, rel=1e-6)
    assert sp["comm"] == pytest.approx(row["predicted"] - sp["compute"]) and sp["comm"] > 0
    assert row["published"] == pytest.approx(16 * 64 / 1168.8) and row["goal_met"] is None


def test_the_differences_between_methods_cancel_the_compute():
    """SlowMo's rows against its all-reduce row: published and predicted differences, read from
    rows whose compute is the same on both sides (a row of another source or cluster is not paired)."""
    rows = [dict(key="ar", cluster="c", flags="--method allreduce", comparable=True, source="S: AR",
                 published=0.42, predicted=0.23),
            dict(key="sgp", cluster="c", flags="--method gossip", comparable=True, source="S: SGP",
                 published=0.30, predicted=0.21),
            dict(key="other", cluster="c", flags="--method gossip", comparable=True, source="T: x",
                 published=0.1, predicted=0.1),
            dict(key="slow", cluster="c", flags="--method gossip", comparable=False, source="S: y",
                 published=1.0, predicted=0.1)]
    (d,) = A.differences(rows)
    assert d["key"] == "sgp" and d["against"] == "ar"
    assert d["published"] == pytest.approx(0.12) and d["predicted"] == pytest.approx(0.02)


def test_accuracy_rows_put_the_published_gap_beside_the_proxys_at_each_budget():
    """The verdict compared: within a point of the reference (and quicker: first to the quality),
    at the proxy's longest budget; rows without proxy runs say so and judge nothing."""
    ep = {m: {str(e): {"mean": v} for e, v in zip((8, 16, 32), vals)}
          for m, vals in (("allreduce", (0.20, 0.16, 0.135)), ("single", (0.19, 0.155, 0.13)))}
    ver = lambda e, ps, ar: dict(epochs=e, methods={"pushsum-ov": dict(final_error=ps),  # noqa: E731
                                                     "allreduce": dict(final_error=ar)})
    final = {"epochs": ep, "pilot": {"check": {"short": ver(8, 0.30, 0.17), "budget": ver(16, 0.20, 0.14),
                                                "check": ver(32, 0.13, 0.125)}}}
    rows = {r["key"]: r for r in A.accuracy(final)}
    g = rows["goyal-accuracy"]
    assert g["published_gap"] == pytest.approx(0.0014) and g["published_reaches"] and g["published_first"]
    assert g["proxy_gaps"] == pytest.approx({"8": 0.01, "16": 0.005, "32": 0.005})
    assert g["proxy_budget"] == 32 and g["proxy_reaches"] and g["agrees"]
    o = rows["slowmo-osgp-accuracy"]
    assert o["published_gap"] == pytest.approx(0.0104) and not o["published_reaches"]
    assert o["proxy_gap"] == pytest.approx(0.005) and o["proxy_reaches"] and o["agrees"] is False
    assert rows["slowmo-sgp-accuracy"]["agrees"] is None and rows["slowmo-sgp-accuracy"]["published_first"]
    assert all(r["proxy_gaps"] is None for r in A.accuracy(None))
    # local SGD's row reads final_map.py's cell once it is complete (its E the budget), else nothing
    assert rows["slowmo-localsgd-accuracy"]["agrees"] is None
    cell = dict(network="v100-10gbe-resnet50", condition="typical", p=32,
                methods={"allreduce": dict(final_error=0.17), "localsgd": dict(final_error=0.25)})
    ls = {r["key"]: r for r in A.accuracy(final, dict(E=8, cells=[cell]))}["slowmo-localsgd-accuracy"]
    assert ls["proxy_gaps"] == pytest.approx({"8": 0.08}) and ls["proxy_budget"] == 8
    assert not ls["published_reaches"] and not ls["proxy_reaches"] and ls["agrees"]
    assert A.accuracy(final, dict(E=8, cells=[dict(cell, p=16)]))[3]["proxy_gaps"] is None
