"""The virtual cluster as an instrument: exact re-timing of a recorded run under another profile and
condition (``python -m scalesgd.virtual retime``), the conditions' variability (noise, delays, slow
nodes), and the gradient all-reduce's progress model.  In-process: the virtual cluster needs no MPI."""
import json
import math

import numpy as np
import pytest

from helpers import TINY
from synth import make_dataset

from scalesgd.errors import ConfigError, RunDirError
from scalesgd.virtual.timetape import Stamp, Tape, evaluate
from scalesgd.virtual import profile as P
from scalesgd.virtual import retime as R
from scalesgd.virtual import run as VR
from scalesgd.virtual import variability as V


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("rdata"), n=96, n_val=16, num_classes=4)


def vrun(args, run_dir, data):
    assert VR.main([*args, "--data", str(data), *TINY, "--epochs", "2", "--threads", "1",
                    "--run-dir", str(run_dir)]) == 0
    return run_dir


def same_run(a, b, ranks):
    """Every metrics row equal (times included, bit for bit), and the summaries but for the fields
    that say how each was made."""
    for r in range(ranks):
        rows_a = (a / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()
        rows_b = (b / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()
        assert rows_a == rows_b, (r, next((x, y) for x, y in zip(rows_a, rows_b) if x != y))
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    va, vb = sa.pop("virtual"), sb.pop("virtual")
    assert sa == sb
    for key in ("simulated_seconds", "worker_steps", "node_bytes_sent", "profile", "condition"):
        assert va[key] == vb[key], key


HOST = {"name": "host-tcp", "description": "two ranks a node, host MPI", "step_seconds": 0.02,
        "link_gbps": 1.0, "latency_us": 30, "ranks_per_node": 2, "intra_gbps": 50, "mem_gbps": 20,
        "allreduce_progress": "host", "host_allreduce_factor": 1.7, "variability": "typical"}

CASES = {"allreduce": ["--method", "allreduce", "--workers", "4"],
         "allreduce-overlap": ["--method", "allreduce", "--workers", "3", "--overlap"],
         "localsgd-slowmo": ["--method", "localsgd", "--workers", "4", "--tau", "2", "--slowmo-beta", "0.5"],
         "single": ["--method", "single", "--workers", "1"]}


@pytest.mark.parametrize("case", list(CASES))
def test_a_retimed_run_equals_a_full_run_under_that_profile(case, data, tmp_path):
    """One run under the default profile, re-timed under two others (a stand-in profile with Jin's
    stragglers; a host-MPI profile of two ranks a node with typical noise): each equals a full
    virtual run under that profile and condition, every metrics row and the summary, bit for bit."""
    args = CASES[case]
    src = vrun([*args, "--profile", "a100-100gbit"], tmp_path / "src", data)
    host = tmp_path / "host.json"
    host.write_text(json.dumps(HOST))
    ranks = json.loads((src / "virtual.json").read_text())["ranks"]
    for prof, cond in (("titanx-fdr-resnet18", "stragglers"), (str(host), None)):
        out = tmp_path / f"rt-{P.load(prof).name}"
        assert VR.main(["retime", str(src), "--profile", prof, *(["--condition", cond] if cond else []),
                        "--run-dir", str(out)]) == 0
        full = vrun([*args, "--profile", prof, *(["--condition", cond] if cond else [])],
                    tmp_path / f"full-{P.load(prof).name}", data)
        same_run(out, full, ranks)
        rt = json.loads((out / "virtual.json").read_text())
        assert rt["timeline"] == "retime" and rt["retimed_from"] == str(src)
        a, b = (json.loads((d / "summary.json").read_text()) for d in (src, out))
        assert a["history"][-1]["val_top1_accuracy"] == b["history"][-1]["val_top1_accuracy"]
        assert a["train_seconds"] != b["train_seconds"]            # (another clock, the same numbers)


def test_retime_refuses_what_it_cannot_time_exactly(data, tmp_path, capsys):
    gossip = vrun(["--method", "gossip", "--workers", "2"], tmp_path / "gossip", data)
    assert VR.main(["retime", str(gossip), "--profile", "a100-100gbit"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a gossip run cannot be re-timed: its arithmetic depends on the order" in err[0]
    with pytest.raises(RunDirError, match="not a virtual run"):
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "config.json").write_text(json.dumps({"train": {"method": "allreduce"}}))
        R.check(tmp_path / "real")
    ckpt = vrun(["--method", "allreduce", "--workers", "2", "--checkpoint-minutes", "1e-9"],
                tmp_path / "ckpt", data)
    with pytest.raises(ConfigError, match="checkpoints every .* minutes of the clock"):
        R.check(ckpt)
    ok = vrun(["--method", "allreduce", "--workers", "2"], tmp_path / "ok", data)
    (ok / "timeline" / "rank-1.json.gz").unlink()
    with pytest.raises(RunDirError, match="no timeline tape"):
        R.retime(ok, P.load("a100-100gbit"), V.load("none"))
    one = vrun(["--method", "single", "--workers", "1"], tmp_path / "one", data)
    with pytest.raises(RunDirError, match="already holds a run"):
        R.retime(one, P.load("a100-100gbit"), V.load("none"), ckpt)


def test_stamps_record_the_arithmetic_and_evaluate_it_again():
    tape = Tape()
    a, b = tape.read(1.5), tape.read(4.0)
    total = 0.0
    total += b - a                        # the loop's "time += clock() - t"
    x = (10 + total) * 2 / b - a
    assert isinstance(x, Stamp) and x == (10 + 2.5) * 2 / 4.0 - 1.5
    assert not isinstance(float(x), Stamp) and type(json.loads(json.dumps({"t": x}))["t"]) is float
    vals = evaluate(json.loads(json.dumps(tape.nodes)), [2.0, 7.0])
    assert vals[x.node] == (10 + (7.0 - 2.0)) * 2 / 7.0 - 2.0
    neg = -a
    assert neg == -1.5 and evaluate(tape.nodes, [3.0, 1.0])[neg.node] == -3.0


def test_conditions_load_and_bad_ones_are_refused(tmp_path):
    assert {"none", "typical", "stragglers"} <= set(V.available())
    for name in V.available():
        c = V.load(name)
        assert c.name == name and c.source and c.description
    assert V.load("none").none and not V.load("typical").none
    bad = tmp_path / "bad.json"
    for raw, needle in (({"name": "x", "noise": {"dist": "cauchy", "cv": 1}}, "noise is"),
                        ({"name": "x", "delays": {"dist": "weibull", "prob": 0.1}}, "delays.dist"),
                        ({"name": "x", "delays": {"dist": "uniform", "prob": 0.1, "low": 2}}, "take prob"),
                        ({"name": "x", "delays": {"dist": "pareto", "prob": 0.1, "scale": 1, "alpha": 1}},
                         "alpha > 1"),
                        ({"name": "x", "slow_nodes": {"fraction": 2, "factor": 2}}, "slow_nodes is"),
                        ({"name": "x", "jitter": 1}, "unknown key"),
                        ({"name": "x", "noise": 0.02}, "noise is dict, got 0.02")):
        bad.write_text(json.dumps(raw))
        with pytest.raises(ConfigError, match=needle):
            V.load(str(bad))
    with pytest.raises(ConfigError, match="no such condition"):
        V.load("sunny")
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"name": "p", "variability": "sunny"}))
    with pytest.raises(ConfigError, match="variability"):
        P.load(str(prof))
    prof.write_text(json.dumps({"name": "p", "allreduce_progress": "maybe"}))
    with pytest.raises(ConfigError, match="allreduce_progress"):
        P.load(str(prof))


def test_variability_draws_what_the_condition_states():
    n = 20000
    logn = V.Variability(V.Condition("x", noise={"dist": "lognormal", "cv": 0.2}), 0, range(1), lambda r: r)
    t = np.array([logn(0, 1.0) for _ in range(n)])
    assert abs(t.mean() - 1) < 0.01 and abs(t.std() / t.mean() - 0.2) < 0.01
    assert np.mean(t > 1.5) > 0.01              # heavy right tail: ~2% beyond +2.5 sd (normal: 0.6%)
    jin = V.load("stragglers")
    v = V.Variability(jin, 3, range(1, 33), lambda r: r)   # 32 workers: 2 delayed every step
    assert len(v.delayed) == 2 and not v.slow
    delayed = [v(r, 0.1) for r in sorted(v.delayed) for _ in range(2000)]
    assert 0.1 + 0.1 * 0.85 < np.mean(delayed) < 0.1 + 0.1 * 1.05     # + U(0, 1.9) steps: 0.95 mean
    quiet = [v(r, 0.1) for r in range(1, 33) if r not in v.delayed for _ in range(50)]
    assert max(quiet) < 0.1 * 1.5
    slow = V.Variability(V.Condition("s", slow_nodes={"fraction": 0.25, "factor": 3.0}), 0, range(16),
                         lambda r: r // 2)     # 8 nodes of 2: 2 slow nodes = 4 slow ranks
    assert len(slow.slow) == 4 and {r // 2 for r in slow.slow}.__len__() == 2
    assert slow(min(slow.slow), 0.1) == pytest.approx(0.3)
    rare = V.Variability(V.Condition("r", delays={"prob": 0.01, "dist": "exponential", "mean": 5.0}), 0,
                         range(1), lambda r: r)
    t = np.array([rare(0, 1.0) for _ in range(n)]) - 1.0
    assert 0.005 < np.mean(t > 0) < 0.015 and 3.5 < t[t > 0].mean() < 6.5


def test_a_ranks_draws_do_not_depend_on_the_order_ranks_ask():
    c = V.load("typical")
    a, b = (V.Variability(c, 7, range(4), lambda r: r) for _ in range(2))
    first = [[a(r, 1.0) for _ in range(5)] for r in range(4)]
    second = [[None] * 5 for _ in range(4)]
    for k in range(5):
        for r in reversed(range(4)):
            second[r][k] = b(r, 1.0)
    assert first == second


def test_host_progress_exposes_the_whole_all_reduce_and_async_hides_it(data, tmp_path):
    """The same job under two progress models: comm + wait per step with host MPI is the whole
    all-reduce (x the profile's factor); with NCCL-like progress and --overlap most of it hides."""
    base = {k: v for k, v in HOST.items() if k not in ("allreduce_progress", "host_allreduce_factor")}
    base.update(ranks_per_node=1, variability="none", link_gbps=0.5)
    per = {}
    for mode in ("async", "host"):
        prof = tmp_path / f"{mode}.json"
        prof.write_text(json.dumps({**base, "name": mode, "allreduce_progress": mode}))
        d = vrun(["--method", "allreduce", "--workers", "2", "--overlap", "--profile", str(prof)],
                 tmp_path / mode, data)
        rows = [json.loads(x) for x in (d / "metrics" / "rank-1.jsonl").read_text().splitlines()
                if '"kind": "step"' in x]
        per[mode] = (rows[-1]["train_seconds"] - rows[0]["train_seconds"]) / (len(rows) - 1)
    params = json.loads((tmp_path / "host" / "summary.json").read_text())["num_params"]
    ring = 2 * 0.5 * params * 4 / (0.5e9 / 8) + 2 * 30e-6
    assert per["host"] == pytest.approx(0.02 + ring, rel=0.05)
    assert per["async"] == pytest.approx(0.02 + max(ring - 2 / 3 * 0.02, ring / 8), rel=0.05)
    assert math.isclose(per["host"] - per["async"], min(2 / 3 * 0.02, 7 / 8 * ring), rel_tol=0.1)
    prof = tmp_path / "hidden.json"                 # host MPI whose bucket launches move 60% of it
    prof.write_text(json.dumps({**base, "name": "hidden", "allreduce_progress": "host",
                                "host_allreduce_factor": 1.5, "host_hidden_fraction": 0.6}))
    d = vrun(["--method", "allreduce", "--workers", "2", "--overlap", "--profile", str(prof)],
             tmp_path / "hidden", data)
    rows = [json.loads(x) for x in (d / "metrics" / "rank-1.jsonl").read_text().splitlines()
            if '"kind": "step"' in x]
    step = (rows[-1]["train_seconds"] - rows[0]["train_seconds"]) / (len(rows) - 1)
    assert step == pytest.approx(0.02 + 1.5 * (1 - 0.6) * ring, rel=0.05)


BLOCK_DALI = """
import sys
class NoDali:
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, NoDali())
"""


@pytest.mark.parametrize("entry", ["scalesgd.virtual.run", "scalesgd.cli"])
def test_without_dali_training_stops_at_start_with_one_line_and_writes_nothing(entry, tmp_path):
    """DALI comes from an extra (cpu, cuda12, cuda13), not the base install: without it a run says
    what to install, in one line, before a run directory exists."""
    import subprocess
    import sys
    from helpers import ROOT, demo_data
    run_dir = tmp_path / "run"
    code = BLOCK_DALI + (f"from {entry} import main; sys.exit(main(['--method', 'single', '--epochs', '1', "
                         f"'--run-dir', {str(run_dir)!r}]))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "SCALESGD_DATA": demo_data(tmp_path)})
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith(("scalesgd: error", "Traceback"))]
    assert p.returncode != 0 and len(lines) == 1, p.stderr[-2000:]
    assert "DALI" in lines[0] and "pip install -e '.[cpu]'" in lines[0]
    assert not run_dir.exists()


STOPPING = {"allreduce": ["--method", "allreduce"], "easgd": ["--method", "easgd"],
            "asgd-2": ["--method", "asgd", "--servers", "2"], "pull": ["--method", "gossip"],
            "push-overlap": ["--method", "gossip", "--gossip", "push", "--gossip-overlap"],
            "localsgd": ["--method", "localsgd", "--tau", "2"]}


@pytest.mark.parametrize("case", list(STOPPING))
def test_stop_at_error_ends_every_rank_at_that_validation_with_a_final_checkpoint(case, data, tmp_path):
    """``--stop-at-error``: the first validation at or below the error ends the run on every rank
    (the servers too), with its final checkpoint; the summary says where.  Any error is at or
    below 0.999, so the run ends at its first validation (a quarter of its 2 epochs)."""
    out = vrun([*STOPPING[case], "--workers", "4", "--eval-every", "0.5", "--stop-at-error", "0.999"],
               tmp_path / case, data)
    s = json.loads((out / "summary.json").read_text())
    first = s["history"][0]["global_samples"]
    assert len(s["history"]) == 1 and s["stopped_at_error"] == dict(error=0.999, global_samples=first,
                                                                      epochs=first / (s["samples"] / 0.5))
    ranks = json.loads((out / "virtual.json").read_text())["ranks"]
    for r in range(ranks):
        vals = [x for x in (out / "metrics" / f"rank-{r}.jsonl").read_text().splitlines() if '"val"' in x]
        assert len(vals) == 1, (r, vals)
    assert len(list((out / "checkpoints").glob("*.h5"))) == 1
    if case in ("allreduce", "easgd"):                    # never reached: every epoch
        never = vrun([*STOPPING[case], "--workers", "4", "--eval-every", "0.5", "--stop-at-error", "1e-9"],
                     tmp_path / f"{case}-never", data)
        s = json.loads((never / "summary.json").read_text())
        assert s["stopped_at_error"] is None and len(s["history"]) == 4


def test_a_run_stopped_at_its_target_retimes_exactly(data, tmp_path):
    args = ["--method", "allreduce", "--workers", "4", "--eval-every", "0.5", "--stop-at-error", "0.999"]
    src = vrun([*args, "--profile", "a100-100gbit"], tmp_path / "src", data)
    out = tmp_path / "rt"
    assert VR.main(["retime", str(src), "--profile", "titanx-fdr-resnet18", "--condition", "typical",
                    "--run-dir", str(out)]) == 0
    full = vrun([*args, "--profile", "titanx-fdr-resnet18", "--condition", "typical"], tmp_path / "full",
                data)
    same_run(out, full, 4)


@pytest.mark.parametrize("method", ["allreduce", "easgd", "gossip"])
def test_linear_scaling_scales_with_the_global_batch_for_every_method(method, data, tmp_path):
    """``--linear-scaling``: peak = lr x (batch x workers) / reference_batch, whatever the method
    (as SGP and SlowMo compare methods); a server rank is not a worker."""
    out = vrun(["--method", method, "--workers", "4", "--linear-scaling", "--reference-batch", "8",
                "--lr", "0.01", "--schedule", "constant"], tmp_path / method, data)
    rows = [json.loads(x) for x in (out / "metrics" / "rank-1.jsonl").read_text().splitlines()]
    lrs = {r["lr"] for r in rows if r["kind"] == "step"}
    assert lrs and all(x == pytest.approx(0.04) for x in lrs), lrs


def test_local_sgd_replicas_wait_for_each_other_only_at_an_exchange(data, tmp_path):
    """Local SGD under Jin's stragglers: between exchanges each replica runs on its own clock (no
    per-step collective makes every step wait for the slowest worker); after each average, every
    rank's clock agrees.  A stop request travels with the exchange (tests/test_signals)."""
    tau, ranks = 3, 4
    run = vrun(["--method", "localsgd", "--workers", str(ranks), "--tau", str(tau),
                "--profile", "titanx-fdr-resnet18", "--condition", "stragglers"], tmp_path / "run", data)
    steps = []
    for r in range(ranks):
        rows = [json.loads(x) for x in (run / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()]
        steps.append({x["step"]: x["train_seconds"] for x in rows if x["kind"] == "step"})
    assert len(steps[0]) >= 2 * tau and all(s.keys() == steps[0].keys() for s in steps)
    apart = [k for k in steps[0] if len({s[k] for s in steps}) > 1]
    assert apart and all(k % tau for k in apart), apart       # apart only within a period
    assert any(k % tau == 0 for k in steps[0])
