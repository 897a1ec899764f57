"""The virtual cluster (``python -m scalesgd.virtual``): exact replay of real MPI runs, the first
difference named when a replay diverges, the scheduler's deadlock report, and a virtual run at
many workers that the plot command draws beside a real one."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import ROOT, TINY, demo_data, final_arrays, launch, one_line_error, run_cli
from synth import make_dataset

from scalesgd.backend import blas_threads_for
from scalesgd.virtual import run as VR
from scalesgd.virtual.transport import tree_sum
from scalesgd.virtual.world import Aborted, Deadlock, World

RANKS = 4


def virtual(args, tmp_path, timeout=300):
    return run_cli(args, tmp_path, timeout, module="scalesgd.virtual")


def ok(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def replay_here(run, replay):
    """``--replay RUN --run-dir REPLAY`` in this process, one BLAS thread (the real runs' own): the
    same code as the command (``virtual()``, whose messages the tests below read), without a new
    process's start-up."""
    assert VR.main(["--replay", str(run), "--run-dir", str(replay), "--threads", "1"]) == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("vdata"), n=96, n_val=16, num_classes=4)


CASES = {                              # name: flags of a 4-rank run
    "allreduce": ["--method", "allreduce"],
    "easgd": ["--method", "easgd"],
    "asgd": ["--method", "asgd"],
    "asgd-2-servers": ["--method", "asgd", "--servers", "2"],
    "gossip-pull": ["--method", "gossip", "--gossip", "pull"],
    "gossip-pull-overlap": ["--method", "gossip", "--gossip", "pull", "--gossip-overlap"],
    "localsgd-slowmo": ["--method", "localsgd", "--tau", "2", "--slowmo-beta", "0.5"],
}


# the all-reduce, the sharded server and the overlapped read, one per protocol, in float32 (where a
# sum in another order rounds differently: the stricter check of the order, so they skip float64);
# every other case in float64 (every case in both took 14 runs)
FLOAT32 = ("allreduce", "asgd-2-servers", "gossip-pull-overlap")
# (pull gossip in float64: its run goes through a resume in test_a_stopped_and_resumed_pull_gossip_...)
REPLAYS = [(c, "float64") for c in CASES if c not in (*FLOAT32, "gossip-pull")] + \
    [(c, "float32") for c in FLOAT32]


@pytest.mark.mpi
@pytest.mark.parametrize("case,dtype", REPLAYS)
def test_replay_of_a_real_run_is_bit_identical(case, dtype, data, tmp_path):
    run = tmp_path / "run"
    args = [*CASES[case], "--data", str(data), *TINY, "--epochs", "2", "--dtype", dtype,
            "--run-dir", str(run)]
    ok(run_cli(args, tmp_path, launcher=launch(RANKS)))
    replays_bit_for_bit(run, tmp_path, ordered=case != "allreduce")


def replays_bit_for_bit(run, tmp_path, ordered=True):
    """The run ``run`` replayed in the virtual cluster: every rank's trace kept (``ordered``: the
    order MPI decided was recorded), the replay's final state and accuracy the run's, every bit, on
    as many BLAS threads as the run's ranks had."""
    events = sum(1 for _ in (run / "trace").glob("rank-*.jsonl"))
    assert events == RANKS
    if ordered:
        assert any((run / "trace" / f"rank-{r}.jsonl").read_text() for r in range(RANKS))
    replay = tmp_path / "replay"
    replay_here(run, replay)
    summary = json.loads((replay / "summary.json").read_text())
    assert summary["virtual"]["timeline"] == "replay"
    assert summary["virtual"]["replay_first_difference"] is None
    recorded = json.loads((run / "summary.json").read_text())["blas_threads"]   # (cores // 4 ranks)
    assert summary["virtual"]["blas_threads"] == recorded     # the replay computes with as many
    real, again = final_arrays(run), final_arrays(replay)
    assert sorted(real) == sorted(again)
    for name in real:                  # params, momentum, BN statistics, method state: every bit
        assert np.array_equal(real[name], again[name]), name
    real_summary = json.loads((run / "summary.json").read_text())
    assert real_summary["history"][-1]["val_top1_accuracy"] == summary["history"][-1]["val_top1_accuracy"]
    # the ranks' BLAS threads (cli: the cores over the ranks), which a replay's GEMMs need
    assert real_summary["blas_threads"] == blas_threads_for(RANKS, env={"OMP_NUM_THREADS": "1"})


@pytest.mark.mpi
@pytest.mark.parametrize("dtype,overlap", [("float32", False), ("float32", True)])   # (float32: as above)
def test_push_sum_replay_is_bit_identical(dtype, overlap, data, tmp_path):
    """Push-sum: each drain takes whole messages and records their senders in the order they
    were added (comm/mpi/inbox.py's turns); the replay adds the same messages in that order, so the
    final checkpoint equals the run's bit for bit, however many messages a drain summed."""
    run, replay = tmp_path / "run", tmp_path / "replay"
    ok(run_cli(["--method", "gossip", "--gossip", "push", "--data", str(data), *TINY, "--epochs", "2",
                "--dtype", dtype, "--run-dir", str(run), *(["--gossip-overlap"] if overlap else [])],
               tmp_path, launcher=launch(RANKS)))
    drains = [json.loads(line) for r in range(RANKS)
              for line in (run / "trace" / f"rank-{r}.jsonl").read_text().splitlines()
              if '"drain"' in line]
    assert drains and all(sorted(d["order"]) == sorted(s for s, c in d["got"] for _ in range(c))
                          for d in drains)
    replay_here(run, replay)
    summary = json.loads((replay / "summary.json").read_text())
    assert summary["virtual"]["replay_first_difference"] is None
    real, again = final_arrays(run), final_arrays(replay)
    assert sorted(real) == sorted(again)
    for name in real:
        assert np.array_equal(real[name], again[name]), name
    print(f"push-sum replay, {dtype}{', overlapped' if overlap else ''}: bit-identical (at most "
          f"{max(len(d['order']) for d in drains)} messages in one drain, "
          f"{sum(len(d['order']) > 2 for d in drains)} drains of three or more)")


@pytest.mark.mpi
def test_a_stopped_and_resumed_pull_gossip_run_replays_exactly(data, tmp_path):
    """The trace of a resumed run is that of a run that went through: pull gossip's publication
    numbers continue across the resume, the events after the checkpoint are cut.  (Also pull
    gossip's case of test_replay_of_a_real_run_is_bit_identical, in float64.)"""
    run = tmp_path / "run"
    args = ["--method", "gossip", "--gossip", "pull", "--data", str(data), *TINY, "--dtype", "float64",
            "--run-dir", str(run)]
    ok(run_cli(args, tmp_path, launcher=launch(RANKS)))
    ok(run_cli([*args, "--resume", str(run), "--epochs", "2"], tmp_path, launcher=launch(RANKS)))
    replays_bit_for_bit(run, tmp_path)


@pytest.mark.mpi
def test_a_push_sum_run_with_unscheduled_checkpoints_is_refused(data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli(["--method", "gossip", "--gossip", "push", "--data", str(data), *TINY, "--epochs", "3",
                "--checkpoint-minutes", "0.00001", "--run-dir", str(run)], tmp_path,
               launcher=launch(RANKS)))
    reasons = [json.loads(line)["reason"]
               for line in (run / "trace" / "rank-0.jsonl").read_text().splitlines()
               if '"checkpoint"' in line]
    assert "clock" in reasons, reasons          # rank 0's clock asked for checkpoints before the end
    p = virtual(["--replay", str(run), "--run-dir", str(tmp_path / "replay")], tmp_path)
    assert p.returncode == 1 and "outside its final schedule (clock" in p.stderr, p.stderr[-2000:]


def test_a_stragglers_delay_adds_to_its_measured_compute(data, tmp_path):
    """With a measured profile, the straggler's sleep is simulated time on top of the step's real
    compute (not instead of it): its steady per-step compute is the delay plus a step's compute.
    (Compared as the straggler's own compute seconds a step: a step's whole time also waits for the
    other rank's measured compute, twice the load's noise; under load that failed once.)"""
    def per_step(name, extra=()):
        d = tmp_path / name
        ok(virtual(["--method", "allreduce", "--workers", "2", "--data", str(data), *TINY, "--epochs", "4",
                    "--profile", "cpu-emulated-papers", "--run-dir", str(d), *extra], tmp_path))
        rows = (d / "metrics" / "rank-1.jsonl").read_text().splitlines()
        t = [json.loads(x)["compute_seconds"] for x in rows if '"kind": "step"' in x]    # (cumulative)
        return float(np.median(np.diff(t)[1:]))          # steady state: without the first step
    before = per_step("plain")
    slow = per_step("slow", ["--straggler", "1:200"])
    plain = min(before, per_step("plain-after"))         # (a plain run on each side of the slow one:
    assert plain > 0 and slow - 0.2 >= 0.5 * plain, (plain, slow)   # load that slows both slows it
                                                         # too; the swallowed compute gave 0.2 flat)


@pytest.mark.mpi
def test_a_diverging_replay_names_the_first_exchange(data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli(["--method", "easgd", "--data", str(data), *TINY, "--run-dir", str(run)], tmp_path,
               launcher=launch(RANKS)))
    cfg = json.loads((run / "config.json").read_text())
    cfg["schedule"]["lr"] = 0.0123                    # the replay computes something else
    (run / "config.json").write_text(json.dumps(cfg))
    replay = tmp_path / "replay"
    replay_here(run, replay)
    diff = json.loads((replay / "summary.json").read_text())["virtual"]["replay_first_difference"]
    # the server's first push is still the initial model (identical); the first one computed
    # from a step differs, and the difference names its rank, event and exchange
    assert diff is not None and diff.startswith("rank 0, event ") and "(serve, worker " in diff, diff
    assert "d: run " in diff, diff


@pytest.mark.mpi
def test_many_virtual_workers_write_a_run_the_plot_draws_beside_a_real_one(data, tmp_path):
    real = tmp_path / "real"
    ok(run_cli(["--method", "gossip", "--data", str(data), *TINY, "--run-dir", str(real)], tmp_path,
               launcher=launch(RANKS)))
    v = tmp_path / "virtual"
    p = ok(virtual(["--method", "gossip", "--workers", "12", "--data", str(data), *TINY,
                    "--batch-size", "4", "--profile", "a100x8-100gbit", "--run-dir", str(v)], tmp_path))
    assert "12 virtual workers" in p.stdout
    summary = json.loads((v / "summary.json").read_text())
    assert summary["workers"] == 12 and summary["virtual"]["time"] == "simulated seconds"
    assert summary["virtual"]["profile"]["name"] == "a100x8-100gbit"
    # asynchronous: every worker steps until the phase at the end, at least an epoch's share each
    assert summary["virtual"]["worker_steps"] >= 12 * (96 // (12 * 4))
    assert len(list((v / "metrics").glob("rank-*.jsonl"))) == 12
    # 8 ranks per node: nodes 0 and 1 sent the bytes of gossip reads across the link
    assert sum(summary["virtual"]["node_bytes_sent"]) > 0
    png = tmp_path / "cmp.png"
    ok(subprocess.run([sys.executable, "-m", "scalesgd.plot", str(real), str(v), "-o", str(png)],
                      cwd=ROOT, capture_output=True, text=True, timeout=120))
    assert png.stat().st_size > 0


@pytest.mark.mpi
def test_ctrl_c_checkpoints_and_resume_finishes(data, tmp_path):
    v = tmp_path / "v"
    args = ["--method", "asgd", "--workers", "3", "--data", str(data), *TINY, "--epochs", "40",
            "--profile", "cpu-emulated-papers", "--run-dir", str(v)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "scalesgd.virtual", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t = time.monotonic()
    while not list((v / "metrics").glob("rank-1.jsonl")) or \
            (v / "metrics" / "rank-1.jsonl").read_text().count("\n") < 5:
        assert proc.poll() is None and time.monotonic() - t < 120, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, out + err
    assert list((v / "checkpoints").glob("ckpt-*.h5")), err
    p = ok(virtual([*args[:-2], "--run-dir", str(v), "--resume", str(v), "--epochs", "3"], tmp_path))
    assert "done:" in p.stdout


def test_tree_sum_is_mpichs_pairwise_order():
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(1000) * np.exp(3 * rng.standard_normal(1000))).astype(np.float32)
          for _ in range(5)]
    assert np.array_equal(tree_sum(xs[:4]), (xs[0] + xs[1]) + (xs[2] + xs[3]))
    assert not np.array_equal(tree_sum(xs[:4]), ((xs[0] + xs[1]) + xs[2]) + xs[3])
    # p = 5: ranks 0 and 1 folded first, then the pairwise tree over the remaining four
    assert np.array_equal(tree_sum(xs), ((xs[0] + xs[1]) + xs[2]) + (xs[3] + xs[4]))


def test_the_world_runs_in_clock_order_and_reports_a_deadlock():
    w, order = World(3), []

    def body(r):
        def main():
            w.advance(r, [3.0, 1.0, 2.0][r])
            order.append(r)
        return main
    w.run([body(r) for r in range(3)])
    assert order == [1, 2, 0] and w.clock == [3.0, 1.0, 2.0]

    w = World(2)

    def waits_for_ever():
        w.block(0, lambda: None, "waiting for a message nobody sends")

    with pytest.raises(Deadlock, match="rank 0 at 0.000 s: waiting for a message nobody sends"):
        w.run([waits_for_ever, lambda: None])

    w = World(2)

    def fails():
        raise ValueError("boom")

    def blocked():
        w.block(1, lambda: None, "a partner that failed")
    with pytest.raises(ValueError, match="boom"):
        w.run([fails, blocked])
    assert issubclass(Aborted, BaseException)


def test_profiles_load_and_bad_ones_are_refused(tmp_path):
    from scalesgd.errors import ConfigError
    from scalesgd.virtual import profile as P
    assert {"a100-100gbit", "a100x8-100gbit", "cpu-emulated-papers"} <= set(P.available())
    for name in P.available():
        prof = P.load(name)
        assert prof.name == name and prof.link_gbps > 0
    assert P.load("cpu-emulated-papers").measured and not P.load("a100-100gbit").measured
    bad = tmp_path / "bad.json"
    for text, needle in (('{"name": "x", "link_gbsp": 1}', "unknown key(s) link_gbsp"),
                         ('{"name": "x", "link_gbps": 0}', "link_gbps must be > 0"),
                         ('{"name": "x", "rma_progress": "maybe"}', "rma_progress"),
                         ('{"name": "x", "images_per_second": 10}', "needs a reference"),
                         # a network left out is an error, not the defaults' 80 Gbit/s
                         ('{"name": "x", "link_gbps": 10}', "the network is required: latency_us"),
                         ('{"name": "x"}', "the network is required: link_gbps, latency_us"),
                         ('{"link_gbps": 10, "latency_us": 5}', "a profile needs a name"),
                         ('{"name": 3, "link_gbps": 10, "latency_us": 5}', "name is str, got 3"),
                         ('{"name": "x", "link_gbps": "10", "latency_us": 5}',
                          'link_gbps is float, got "10"'),
                         ('{"name": "x", "link_gbps": 10, "latency_us": 5, "ranks_per_node": true}',
                          "ranks_per_node is int, got true"),
                         ('{"name": "x", "link_gbps": 10, "latency_us": 5, "variability": 2}',
                          "variability is str or dict, got 2"),
                         ("{", "cannot read the profile")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            P.load(str(bad))
    with pytest.raises(ConfigError, match="no such profile"):
        P.load("h100-nonexistent")


def test_dry_run_prints_the_config_and_the_cluster_and_runs_nothing(data, tmp_path):
    """--dry-run, as the real program's: the resolved config and the parameter count, then the
    virtual cluster it would run (workers, ranks with the server shards, profile, condition)."""
    v = tmp_path / "v"
    p = ok(virtual(["--method", "easgd", "--servers", "2", "--workers", "6", "--data", str(data), *TINY,
                    "--profile", "v100-10gbe-resnet50", "--condition", "stragglers", "--run-dir", str(v),
                    "--dry-run"], tmp_path))
    assert '"method": "easgd"' in p.stdout and "4 classes): " in p.stdout, p.stdout
    assert p.stdout.splitlines()[-1] == ("virtual: 6 worker(s), 8 rank(s); profile v100-10gbe-resnet50; "
                                         "condition stragglers"), p.stdout
    assert not v.exists() and "validation top-1" not in p.stdout + p.stderr


def test_multiply_accumulates_match_the_published_counts():
    from scalesgd.virtual.profile import model_macs
    assert model_macs("resnet50", 224) / 1e9 == pytest.approx(4.09, rel=0.02)
    assert model_macs("resnet18", 224) / 1e9 == pytest.approx(1.81, rel=0.02)


def test_mismatched_collectives_are_an_error_not_a_silent_combine():
    from scalesgd.virtual.profile import load
    from scalesgd.virtual.cluster import Cluster
    from scalesgd.virtual.transport import InProcessTransport
    w = World(2)
    c = Cluster(w, load("a100-100gbit"))
    nets = [InProcessTransport(c, (0, 1), r) for r in range(2)]

    def rank0():
        nets[0].barrier()

    def rank1():
        nets[1].broadcast(np.zeros(3), 0)
    with pytest.raises(RuntimeError, match="mismatched collectives"):
        w.run([rank0, rank1])


def test_a_batch_the_data_cannot_fill_is_refused_before_anything_is_written(data, tmp_path):
    v = tmp_path / "v"
    p = virtual(["--method", "gossip", "--workers", "64", "--data", str(data), *TINY, "--run-dir", str(v)],
                tmp_path)
    assert p.returncode == 1 and "8 x 64 workers exceeds the 96 training samples" in p.stderr, p.stderr
    assert not v.exists()
    dry = virtual(["--method", "gossip", "--workers", "64", "--data", str(data), *TINY, "--run-dir", str(v),
                   "--dry-run"], tmp_path)                 # the dry run refuses it alike
    assert dry.returncode == 1 and "8 x 64 workers exceeds the 96 training samples" in dry.stderr, dry.stderr
    # the batch the run would use: unset, 64 // 32 = 2, at least 8: 8 x 32 <= the digits' 1438
    assert virtual(["--method", "allreduce", "--workers", "32", "--dry-run"], tmp_path).returncode == 0
    v.mkdir()
    (v / "config.json").write_text("{}")
    dry = virtual(["--method", "gossip", "--workers", "2", "--data", str(data), *TINY, "--run-dir", str(v),
                   "--dry-run"], tmp_path)
    assert dry.returncode == 2 and f"--run-dir {v} already holds a run" in dry.stderr, dry.stderr


@pytest.mark.mpi
def test_a_stand_in_profile_times_the_job_as_its_workload(data, tmp_path):
    """``stands_for``: each step costs the named workload's step (batch / images_per_second, MACs
    scaled from the reference) and every byte sent costs that model's parameters over the job's:
    the same run under a plain profile with the same step sends exactly 1/scale as many bytes."""
    from scalesgd.virtual.profile import model_params
    common = dict(link_gbps=10, latency_us=0, reference={"model": "resnet18", "image_size": 224})
    profiles = {"standin": dict(name="standin", images_per_second=1000, **common,
                                stands_for={"model": "resnet18", "image_size": 224, "batch_size": 32}),
                "plain": dict(name="plain", step_seconds=0.032, link_gbps=10, latency_us=0)}
    got = {}
    for name, prof in profiles.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(prof))
        d = tmp_path / name
        ok(virtual(["--method", "gossip", "--gossip", "pull", "--workers", "2", "--data", str(data), *TINY,
                    "--profile", str(tmp_path / f"{name}.json"), "--threads", "1", "--run-dir", str(d)],
                   tmp_path))
        s = json.loads((d / "summary.json").read_text())
        steps = [json.loads(x) for x in (d / "metrics" / "rank-1.jsonl").read_text().splitlines()
                 if '"kind": "step"' in x]
        got[name] = (sum(s["virtual"]["node_bytes_sent"]), steps[-1]["compute_seconds"] / steps[-1]["step"],
                     s["num_params"])
    assert got["standin"][1] == pytest.approx(0.032) and got["plain"][1] == pytest.approx(0.032)
    scale = model_params("resnet18") / got["plain"][2]
    assert got["standin"][0] == pytest.approx(scale * got["plain"][0], rel=1e-3), (got, scale)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(profiles["standin"], stands_for={"model": "resnet18"})))
    p = virtual(["--workers", "2", "--data", str(data), *TINY, "--profile", str(bad)], tmp_path)
    assert p.returncode != 0 and "stands_for is" in p.stderr


def test_a_rank_told_to_hang_is_a_deadlock_naming_it(data, tmp_path):
    """SCALESGD_INJECT_FAULT=RANK:STEP:hang blocks that virtual rank for ever (the transport's
    ``hang``, a receive nobody answers under MPI): once no rank can move, the scheduler ends the
    run naming what each rank was doing."""
    env = dict(os.environ, SCALESGD_DATA=demo_data(tmp_path), OMP_NUM_THREADS="1",
               SCALESGD_INJECT_FAULT="1:2:hang")
    p = subprocess.run([sys.executable, "-m", "scalesgd.virtual", "--method", "allreduce", "--workers", "3",
                        "--data", str(data), *TINY, "--batch-size", "4", "--run-dir", str(tmp_path / "run")],
                       cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=120)
    line = one_line_error(p, "virtual cluster deadlock", "rank 1 at", "hung on purpose")
    assert p.returncode == 1 and "rank 0 at" in line, p.stderr[-2000:]
