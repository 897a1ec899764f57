"""The cost model and the discrete-event simulation against closed forms and each other."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scalesgd.costmodel import calibration, cost, sim

ROOT = Path(__file__).resolve().parents[1]
NET = cost.Net(alpha=5e-6, bandwidth=10e9, mem=20e9)
W = cost.Work("w", step_seconds=0.05, batch=64, param_bytes=40e6)


def test_allreduce_is_the_ring_formula():
    assert cost.allreduce_seconds(1e6, 1, NET) == 0.0
    assert cost.allreduce_seconds(1e6, 2, NET) == pytest.approx(2 * 5e-6 + 1e6 / 10e9)
    # bandwidth term tends to 2 S / B, latency term grows linearly in p
    big = cost.allreduce_seconds(1e9, 1024, NET)
    assert big == pytest.approx(2 * 1023 * 5e-6 + 2 * 1023 / 1024 * 0.1)


def test_mva_limits():
    x1, r1 = cost.server_throughput(1, think=0.05, service=0.01)
    assert x1 == pytest.approx(1 / 0.06) and r1 == pytest.approx(0.01)
    xn, _ = cost.server_throughput(200, think=0.05, service=0.01)
    assert xn == pytest.approx(100.0, rel=1e-6)                  # saturated: 1 / service
    xs = [cost.server_throughput(p, 0.05, 0.01)[0] for p in range(1, 30)]
    assert all(a < b for a, b in zip(xs, xs[1:]))                 # more workers never hurt throughput
    assert cost.saturation_workers(0.05, 0.01) == pytest.approx(6.0)
    assert cost.tau_to_keep_up(16, 0.05, 0.01) == 3               # (16-1)*0.01/0.05 = 3
    assert cost.tau_to_keep_up(1, 0.05, 0.01) == 1
    assert cost.tau_to_keep_up(4, 0.1, 0.3) == 9 and cost.tau_to_keep_up(4, 0.9, 0.3) == 1   # exact ratios


def test_simulated_server_single_worker_is_exact_and_never_stale():
    r = sim.simulate("easgd", 1, W, NET, steps=100)
    ts = cost.server_service_seconds(W.param_bytes, NET)
    assert r.samples_per_second == pytest.approx(W.batch / (W.step_seconds + ts), rel=1e-9)
    assert set(r.staleness) == {0}
    assert r.server_utilization == pytest.approx(ts / (W.step_seconds + ts), rel=1e-6)


def test_simulated_server_saturates_at_one_over_service_and_staleness_is_p_minus_1():
    ts = cost.server_service_seconds(W.param_bytes, NET)
    p = 40                                                     # far beyond saturation (~3.8)
    r = sim.simulate("asgd", p, W, NET, steps=200)
    assert r.samples_per_second == pytest.approx(W.batch / ts, rel=0.02)
    assert r.server_utilization > 0.98
    assert r.staleness_mean == pytest.approx(p - 1, abs=0.5)  # FIFO, everyone queued: round robin
    # below saturation the deterministic simulation and MVA agree on the no-wait bound
    r2 = sim.simulate("easgd", 2, W, NET, steps=300)
    assert r2.samples_per_second == pytest.approx(2 * W.batch / (W.step_seconds + ts), rel=0.05)


def test_simulated_allreduce_pays_for_the_slowest_worker():
    d = 0.3
    st = sim.Straggle(stragglers=1, max_delay=d)
    r = sim.simulate("allreduce", 8, W, NET, steps=3000, straggle=st, seed=1)
    want = W.step_seconds + d / 2 + cost.allreduce_seconds(W.param_bytes, 8, NET)
    assert r.step_seconds == pytest.approx(want, rel=0.03)
    assert sim.simulate("allreduce", 8, W, NET, steps=50).step_seconds == pytest.approx(
        cost.step_seconds("allreduce", 8, W, NET)["step"], rel=1e-9)


def test_simulated_gossip_matches_analytic_and_its_step_is_flat_in_p():
    for p in (8, 64):
        an = cost.step_seconds("gossip", p, W, NET)["step"]
        r = sim.simulate("gossip", p, W, NET, steps=300, seed=p)
        assert r.step_seconds == pytest.approx(an, rel=0.08), p   # NIC collisions add a little
    s8 = sim.simulate("gossip", 8, W, NET, steps=300, seed=3).step_seconds
    s64 = sim.simulate("gossip", 64, W, NET, steps=300, seed=3).step_seconds
    assert s64 / s8 < 1.1
    # one straggler barely slows gossip's other workers, but stalls all-reduce
    st = sim.Straggle(stragglers=1, max_delay=0.3)
    g = sim.simulate("gossip", 16, W, NET, steps=300, straggle=st).samples_per_second
    g0 = sim.simulate("gossip", 16, W, NET, steps=300).samples_per_second
    a = sim.simulate("allreduce", 16, W, NET, steps=300, straggle=st).samples_per_second
    a0 = sim.simulate("allreduce", 16, W, NET, steps=300).samples_per_second
    assert g / g0 > 0.85 and a / a0 < 0.4


def test_fit_link_and_interpolation():
    tab = {s: 3e-6 + s / 5e9 for s in (1e3, 1e4, 1e5, 1e6, 1e7)}
    alpha, bw, misfit = calibration.fit_link(tab)
    assert alpha == pytest.approx(3e-6, rel=1e-6) and bw == pytest.approx(5e9, rel=1e-6) and misfit < 1e-9
    power = {s: 2e-9 * s ** 0.8 for s in (1e3, 1e5, 1e7)}
    for s in (3e3, 2e6, 5e7, 100.0):
        assert calibration.at(power, s) == pytest.approx(2e-9 * s ** 0.8, rel=1e-9)


def test_calibration_errors_are_clear(tmp_path):
    with pytest.raises(calibration.CalibrationError, match="benchmarks/calibrate.py"):
        calibration.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(calibration.CalibrationError, match="not a calibration file"):
        calibration.load(bad)
    cal = fake_calibration()
    with pytest.raises(calibration.CalibrationError, match="no 16-rank"):
        calibration.table(cal, "get", 16)


def fake_calibration() -> dict:
    sizes = [str(256 * 4 ** k * 4) for k in range(7)]
    mpi = {}
    for p in (2, 3):
        mpi[str(p)] = {k: {s: 1e-5 * p + float(s) / 5e9 for s in sizes}
                       for k in ("allreduce", "get", "accumulate", "server")}
    return {"cores": 2, "compute": {"resnet20_b16": {"seconds": 0.08, "num_params": 272474},
                                    "mix": {s: float(s) / 10e9 for s in sizes}},
            "end_to_end": {"resnet20_b16": {"seconds": 0.09}}, "mpi": mpi,
            "contended_compute": {"1": 0.08, "2": 0.1, "3": 0.2}, "data_seconds": {"resnet20_b16": 0.01}}


def test_model_cli_validates_and_projects(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(fake_calibration()))
    measured = tmp_path / "m.json"
    step = {"mean": 0.1}
    measured.write_text(json.dumps({"runs": {
        "allreduce/w2": {"method": "allreduce", "workers": 2, "ranks": 2, "step_seconds": step},
        "easgd/w2": {"method": "easgd", "workers": 2, "ranks": 3, "step_seconds": step},
        "gossip-push/w2": {"method": "gossip-push", "workers": 2, "ranks": 2, "step_seconds": step}}}))
    out, fig = tmp_path / "out.json", tmp_path / "fig.png"
    proc = subprocess.run([sys.executable, "-m", "scalesgd.costmodel", "--calibration", str(cal),
                           "--measured", str(measured), "--stragglers", str(tmp_path / "none.json"),
                           "--workers", "8", "32",
                           "--sim-steps", "60", "--figure", str(fig), "--json", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"),
                                                                         "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    rows = {r["run"]: r for r in res["validation"]["rows"]}
    # allreduce at 2 ranks on 2 cores: 0.09 s + the table's all-reduce of 1.09 MB
    nbytes = 272474 * 4
    op = 2e-5 + nbytes / 5e9                                     # every fake table at 2 ranks
    # the one-rank step plus the loader's CPU (no idle core left), stretched by the contention
    t2 = (0.09 + 0.01) * 0.1 / 0.08
    assert rows["allreduce/w2"]["predicted"] == pytest.approx(t2 + op, rel=1e-5)
    # push-sum at 2 ranks: half the steps pick the other rank: Accumulate + two mixing passes
    mix = nbytes / 10e9
    assert rows["gossip-push/w2"]["predicted"] == pytest.approx(t2 + 0.5 * (op + 2 * mix), rel=1e-5)
    # easgd: 3 ranks stretch compute by 0.2 / 0.08; 2 workers at one server (MVA)
    # (the tables are interpolated log-log between measured sizes: 1e-5 relative here)
    tc, ts = (0.09 + 0.01) * 0.2 / 0.08, 3e-5 + nbytes / 5e9
    x, _ = cost.server_throughput(2, tc, ts)
    assert rows["easgd/w2"]["predicted"] == pytest.approx(2 / x, rel=1e-4)
    assert "resnet50" in res["projection"] and fig.stat().st_size > 10_000
    assert "saturates at" in proc.stdout and "all-reduce overtakes it" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "scalesgd.costmodel",
                          "--calibration", str(tmp_path / "x.json")],
                         capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src")})
    assert bad.returncode == 2 and "benchmarks/calibrate.py" in bad.stderr


def test_simulation_accounts_for_every_exchange_in_its_window():
    """Each exchange in the window is counted once in the staleness histogram, and the rate is
    exactly those exchanges' samples over the window; a too-short run is refused."""
    st = sim.Straggle(jitter_cv=0.2, stragglers=2, max_delay=0.1)
    r = sim.simulate("easgd", 6, W, NET, steps=100, straggle=st)
    assert sum(r.staleness.values()) == r.exchanges > 300
    assert 0 < r.server_utilization <= 1 and np.isfinite(r.samples_per_second)
    g = sim.simulate("gossip", 6, W, NET, steps=100, straggle=st)
    assert g.exchanges > 300 and g.staleness == {}
    with pytest.raises(ValueError, match="too short"):
        sim.simulate("easgd", 2, W, NET, steps=1)


def test_server_shards_divide_the_service_and_raise_saturation():
    ts1 = cost.server_service_seconds(W.param_bytes, NET)
    ts4 = cost.server_service_seconds(W.param_bytes, NET, shards=4)
    assert ts4 == pytest.approx(2 * (NET.alpha + W.param_bytes / 4 / NET.bandwidth)
                                + 3 * W.param_bytes / 4 / NET.mem)
    assert ts4 < ts1                                     # a quarter of the bytes per shard
    assert cost.worker_link_surplus(W.param_bytes, NET, 1) == 0.0
    one = cost.step_seconds("easgd", 40, W, NET)
    four = cost.step_seconds("easgd", 40, W, NET, shards=4)
    assert four["saturation_workers"] > 3 * one["saturation_workers"]
    assert four["samples_per_second"] > 3.5 * one["samples_per_second"]   # both saturated at p = 40
    # the simulation agrees: saturated throughput is one exchange per slice's service
    r = sim.simulate("asgd", 40, W, NET, steps=200, shards=4)
    assert r.samples_per_second == pytest.approx(W.batch / ts4, rel=0.02)
    # one worker: nothing to share, the worker's own link sets the exchange time
    r1 = sim.simulate("easgd", 1, W, NET, steps=100, shards=4)
    surplus = cost.worker_link_surplus(W.param_bytes, NET, 4)
    assert r1.samples_per_second == pytest.approx(W.batch / (W.step_seconds + ts4 + surplus), rel=1e-9)


def test_bounded_staleness_rejects_exactly_the_late_pushes():
    p = 8                                          # saturated FIFO: every push is p - 1 stale
    free = sim.simulate("asgd", p, W, NET, steps=200)
    assert max(free.staleness) == p - 1 and free.rejected == 0
    assert free.useful_samples_per_second == pytest.approx(free.samples_per_second)
    for bound in (0, 3):
        r = sim.simulate("asgd", p, W, NET, steps=200, max_staleness=bound)
        assert max(r.staleness) <= bound
        assert 0 < r.rejected < r.exchanges
        assert r.useful_samples_per_second == pytest.approx(
            r.samples_per_second * (r.exchanges - r.rejected) / r.exchanges)
        assert r.samples_per_second == pytest.approx(free.samples_per_second, rel=0.02)  # same time


def test_overlapped_gossip_costs_the_longer_of_compute_and_exchange():
    for S in (40e6, 4e9):                          # exchange shorter, then longer than the compute
        w = cost.Work("w", 0.05, 64, S)
        blocking = cost.step_seconds("gossip", 2, w, NET)
        over = cost.step_seconds("gossip", 2, w, NET, overlap=True)
        exch = blocking["comm"]
        assert over["step"] == pytest.approx(max(w.step_seconds, exch))
        r = sim.simulate("gossip", 2, w, NET, steps=400, overlap=True, seed=1)
        rb = sim.simulate("gossip", 2, w, NET, steps=400, seed=1)
        assert r.step_seconds < rb.step_seconds
        assert r.step_seconds >= w.step_seconds * 0.999
