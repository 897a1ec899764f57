"""benchmarks/experiments.py and its sweeps (benchmarks/sweeps/): the measures on synthetic records,
and real quick sweeps."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

from helpers import one_cpu  # noqa: E402
from sweeps.figures import pm  # noqa: E402
from sweeps.runner import Net, Result, Runner, papers_ratio, ranks_for  # noqa: E402
from sweeps.stats import (  # noqa: E402
    first_reach, mean_curve, mean_spread, measures, merged_training_error, minibatches_to_train_error,
    time_to_train_error)

from scalesgd.io.runs import RunData  # noqa: E402


def fake_result(val_errors, times, steps=None, method="gossip-pull"):
    val = [dict(val_top1_accuracy=1 - e, train_seconds=t, epoch=0.25 * (i + 1))
           for i, (e, t) in enumerate(zip(val_errors, times))]
    data = RunData(Path("/nonexistent"), method, 2, steps or {}, val)
    summary = dict(train_seconds=times[-1], images_per_second=100.0)
    return Result("r", method, 2, data, summary)


def test_first_reach_and_measures():
    assert first_reach([0.5, 0.2, 0.09, 0.05], [1, 2, 3, 4], 0.1) == 3.0
    assert first_reach([0.5, 0.2], [1, 2], 0.1) is None
    steps = {0: [dict(train_seconds=t, top1_error=0.5) for t in (1.0, 2.0, 3.0, 5.0)]}
    m = measures(fake_result([0.5, 0.08, 0.09], [10.0, 20.0, 30.0], steps))
    assert m["final_error"] == pytest.approx(0.09) and m["best_error"] == pytest.approx(0.08)
    assert m["time_to_target"] == 20.0 and m["epochs_to_target"] == 0.5
    assert m["step_seconds"] == pytest.approx(4.0 / 3)


def test_mean_spread_counts_runs_that_never_reached():
    agg = mean_spread([1.0, None, 3.0])
    assert agg == dict(mean=2.0, min=1.0, max=3.0, n=2, missing=1)
    assert mean_spread([None])["mean"] is None
    assert pm(agg) == "2 [1, 3] (1 never)"


def test_merged_training_error_orders_workers_by_time_and_smooths():
    steps = {1: [dict(train_seconds=t, top1_error=1.0) for t in (1, 3, 5, 7)],
             2: [dict(train_seconds=t, top1_error=0.0) for t in (2, 4, 6, 8)]}
    res = fake_result([0.5], [8.0], steps, "asgd")
    t, idx, e = merged_training_error(res, window=2)
    assert t.tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and idx.tolist() == list(range(1, 9))
    assert e.tolist() == [1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert time_to_train_error(res, 0.5, window=2) == 3.0
    assert time_to_train_error(res, 0.1, window=2) is None
    assert minibatches_to_train_error(res, 0.5, window=2) == 3
    assert minibatches_to_train_error(res, 0.1, window=2) is None


def test_mean_curve_averages_seeds_at_each_evaluation():
    a = fake_result([0.4, 0.2], [1.0, 2.0])
    b = fake_result([0.2, 0.1, 0.05], [3.0, 4.0, 5.0])
    t, e, lo, hi = mean_curve([a, b])
    assert t.tolist() == [2.0, 3.0] and e.tolist() == pytest.approx([0.3, 0.15])
    assert lo.tolist() == pytest.approx([0.2, 0.1]) and hi.tolist() == pytest.approx([0.4, 0.2])


def run_driver(*args, timeout=600, one_core=False):
    """``benchmarks/experiments.py ARGS``; ``one_core``: the driver and its runs on this pytest
    worker's CPU (``helpers.one_cpu``), where a one-rank run would otherwise spin two BLAS threads
    beside the other worker's jobs (the sync sweep: 22 s against 62 s, the same numbers)."""
    proc = subprocess.run([*(one_cpu() if one_core else []), sys.executable,
                           str(ROOT / "benchmarks" / "experiments.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def small_data(tmp_path) -> Path:
    """256 random 16-pixel JPEGs in 4 classes (and 32 to validate): 8 steps of the digits job's 2
    workers an epoch, for the sweeps whose quick runs check plumbing, not learning."""
    from synth import make_dataset  # noqa: PLC0415
    return make_dataset(tmp_path / "small", n=256, n_val=32, num_classes=4)


def test_consensus_quick_real_mpi(tmp_path):
    """Gossip with gradients off on 2 and 4 real ranks: distances fall, push-sum keeps the mean."""
    out = run_driver("consensus", "--quick", "--out", str(tmp_path))
    res = json.loads((tmp_path / "consensus.json").read_text())
    assert (tmp_path / "consensus.png").stat().st_size > 10_000
    for key, d in res["runs"].items():
        dist = np.array(d["distance"])
        assert dist[0] == 1.0 and dist[-1] < 0.05, (key, dist)
        assert d["rate_per_exchange"] < 0.8
        if key.startswith("push"):
            assert d["mean_drift"] < 1e-12, d        # push-sum conserves sum w x / sum w
    assert "rate/exchange" in out


def test_experiments_rejects_unknown_name():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "experiments.py"), "nope"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.slow
def test_sync_and_easgd_quick_real_runs(tmp_path):
    """The two sweeps with the most plumbing (per-rank loss averaging; replicas from checkpoints)
    end to end on real runs; a second invocation reuses every run directory."""
    run_driver("sync", "--quick", "--out", str(tmp_path), one_core=True)
    s = json.loads((tmp_path / "sync.json").read_text())
    assert s["workers"] == 2 and len(s["val_error_single"]) == len(s["val_error_allreduce"]) == 2
    # same weights, same 32 samples at step 0: only the BN batch statistics (16 vs 32) differ
    assert s["loss_rel_diff_first_step"] < 0.2
    # the trained weights stay far closer to the one-rank run than another seed's run is
    assert s["final_param_rel_diff"] < 0.4 * s["other_seed_param_rel_diff"]
    # (EASGD's sweep on a small data set: it checks the plumbing, and 8 steps do; the digits' 45 a
    # worker cost 5-7 CPU-s more.  The sync sweep keeps the digits: its weights check needs them.)
    run_driver("easgd", "--quick", "--out", str(tmp_path), "--data", str(small_data(tmp_path)), one_core=True)
    e = json.loads((tmp_path / "easgd.json").read_text())
    row = e["runs"]["beta0.8"][0]
    assert row["exchanges"] > 0 and len(row["worker_errors"]) == 2 and 0 <= row["center_error"] <= 1
    again = run_driver("sync", "--quick", "--out", str(tmp_path), one_core=True)
    assert "0 runs launched, 3 reused" in again          # the 2 runs + the seed-1 run of the weights check


@pytest.mark.parametrize("doc,blocks", [
    ("results.md", {"methods", "sync", "consensus", "virtual-validation", "anchors", "crossover-map",
                     "crossover-claims",
                     "crossover-tuning", "crossover-cells", "crossover-noise", "final-study", "final-map",
                     "rejudge"}),
    ("benchmarks.md", {"cpu-step", "cpu-e2e", "cpu-profile", "conv-candidates"}),
    ("cluster.md", {"buckets"})])
def test_docs_tables_match_the_committed_results(doc, blocks, tmp_path):
    """The generated blocks of docs/results.md, benchmarks.md and cluster.md are what
    benchmarks/report.py makes of the JSON files (so no number in them was typed by hand
    or left stale)."""
    import report  # noqa: PLC0415  (benchmarks/report.py)
    path = ROOT / "docs" / doc
    copy = tmp_path / doc
    copy.write_text(path.read_text())
    done = report.update(copy, ROOT / "results")
    assert blocks <= set(done), done
    assert copy.read_text() == path.read_text(), \
        f"docs/{doc} is stale: run python benchmarks/report.py --update docs/{doc}"


def test_report_update_rewrites_only_marked_blocks(tmp_path):
    import report  # noqa: PLC0415
    res = tmp_path / "results"
    res.mkdir()
    (res / "consensus.json").write_text(json.dumps({"repeats": 2, "rounds": 3, "runs": {"pull/p2": dict(
        variant="pull", ranks=2, distance=[1.0, 0.5, 0.25, 0.125], rate_per_exchange=0.5,
        **{"exchanges_to_1e-3": None}, mean_drift=0.1)}}))
    doc = tmp_path / "d.md"
    doc.write_text("intro\n<!-- begin:consensus -->\nold\n<!-- end:consensus -->\n"
                   "<!-- begin:methods -->\nkeep\n<!-- end:methods -->\n")
    assert report.update(doc, res) == ["consensus"]
    text = doc.read_text()
    assert "old" not in text and "| pull | uniform | 2 | 1.25e-01 | 0.500 | — | 1.0e-01 |" in text \
        and "keep" in text


def test_runner_refuses_one_name_for_two_settings(tmp_path):
    """Two settings sharing a run directory would silently replace each other's runs."""
    r = Runner(tmp_path, quick=False)
    r.keys["allreduce-w2-s0"] = json.dumps({"ranks": 2, "argv": ["something", "else"]})
    with pytest.raises(SystemExit, match="two different settings"):
        r.run("allreduce-w2-s0", "allreduce", 2, ["--seed", "0"])


def test_texture_cells_never_share_a_pixel_between_train_and_val():
    import textures  # noqa: PLC0415  (benchmarks/textures.py; scikit-image only for build())
    rng = np.random.default_rng(0)
    cells = textures.split_cells((660, 550), rng)
    tr, va = set(cells["train"]), set(cells["val"])
    assert not tr & va and len(tr) + len(va) == (660 // 32) * (550 // 32)
    assert len(va) == round(0.2 * (len(tr) + len(va)))
    assert max(r for r, _ in tr | va) * 32 + 32 <= 660 and max(c for _, c in tr | va) * 32 + 32 <= 550


def test_ranks_count_every_server_shard():
    assert ranks_for("easgd", 4) == 5 and ranks_for("easgd", 4, ["--servers", "3"]) == 7
    assert ranks_for("gossip-pull", 4, ["--servers", "3"]) == 4


def test_papers_link_rate_keeps_the_ratio_of_transfer_to_step_time():
    """r = ResNet-18's 46.8 MB over 10 GB/s (100 Gb/s at 80%) / the model's 30.2 ms A100 step; the
    emulated link at p workers moves ResNet-20's 1.09 MB in r x (shared-memory step at p)."""
    r = papers_ratio()
    assert r == pytest.approx(11_689_512 * 4 / 10e9 / (64 / 938 * 1.81 / 4.09))
    assert 0.15 < r < 0.16
    net = Net.__new__(Net)                   # the rate arithmetic only (no cluster, no root)
    net.fixed, net.ratio, net.factor, net.spec = None, r, 1.0, "papers"
    net.step = {2: 0.104, 8: 0.441}
    rate = net.rate_for(2)
    assert rate % 10**6 == 0                  # whole Mbit/s
    assert 272_474 * 4 * 8 / rate / 0.104 == pytest.approx(r, rel=0.01)
    assert net.rate_for(8) < rate / 4         # a slower node gets a proportionally slower link
    with pytest.raises(SystemExit, match="no shared-memory allreduce step at 4 workers"):
        net.rate_for(4)


@pytest.mark.netcluster
@pytest.mark.mpi
def test_extensions_quick_on_emulated_nodes(tmp_path):
    """A sweep on emulated nodes end to end: easgd with one server and with two shards, each rank
    on its own node at 300 Mbit/s; every run directory keeps its nodes' byte counters, and the
    table has the server's service time per exchange."""
    import netcluster  # noqa: PLC0415
    missing = netcluster.requirements_missing()
    if missing:
        pytest.skip(missing)
    # (on 256 small images: 8 steps a worker, against a digits epoch's 45: the same assertions, a
    # server that polls for a fifth of the time; 31 CPU-s before)
    run_driver("extensions", "--quick", "--net", "300mbit", "--out", str(tmp_path), "--data",
               str(small_data(tmp_path)))
    d = json.loads((tmp_path / "extensions-net-300mbit.json").read_text())
    assert d["net"]["fixed_rate"] == 300 * 10**6
    rows = d["runs"]
    assert set(rows) == {"easgd K=1/w2", "easgd K=2/w2"}
    assert (rows["easgd K=1/w2"]["servers"], rows["easgd K=2/w2"]["servers"]) == (1, 2)
    for name, nodes in (("easgd-w2-s0", 3), ("easgd-w2-s0-k2", 4)):
        counters = json.loads((tmp_path / "runs" / name / "netcluster.json").read_text())
        assert counters["nodes"] == nodes and counters["rate_bits"] == 300 * 10**6
        assert all(min(t["sent"], t["received"]) > 272_474 * 4 // nodes for t in counters["traffic"].values())
    for row in rows.values():
        assert row["server_service_ms"] > 0 and 0 < row["server_utilization"] <= 1
        assert row["served"] > 0 and row["net"]["rate_bits"] == 300 * 10**6


def test_prose_values_come_from_the_json(tmp_path):
    """``<!-- v:FILE:PATH:SPEC -->`` markers: rewritten from the JSON (so prose cannot disagree with
    it: the committed docs are checked by test_docs_tables_match_the_committed_results), scaled and
    formatted; a path that is not in the JSON is an error naming it."""
    import report  # noqa: PLC0415
    res = tmp_path / "results"
    res.mkdir()
    (res / "x.json").write_text(json.dumps({"a": {"b": 1.857}, "runs": {"allreduce/p16": {"err": 0.3051}},
                                            "l": [3, 4], "n": None}))
    doc = tmp_path / "d.md"
    doc.write_text("speed-up <!-- v:x.json:a.b:.2f -->1.93<!-- /v -->x, error "
                   "<!-- v:x.json:runs.[allreduce/p16].err:.1f*100 -->99<!-- /v -->%, "
                   "<!-- v:x.json:l.1 -->?<!-- /v --> and <!-- v:x.json:n -->?<!-- /v -->\n")
    report.update(doc, res)
    assert doc.read_text() == ("speed-up <!-- v:x.json:a.b:.2f -->1.86<!-- /v -->x, error "
                               "<!-- v:x.json:runs.[allreduce/p16].err:.1f*100 -->30.5<!-- /v -->%, "
                               "<!-- v:x.json:l.1 -->4<!-- /v --> and <!-- v:x.json:n -->—<!-- /v -->\n")
    doc.write_text("<!-- v:x.json:a.c -->1<!-- /v -->")
    with pytest.raises(KeyError, match="a.c: no 'c'"):
        report.update(doc, res)
