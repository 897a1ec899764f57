"""Surviving a lost rank in the virtual cluster (``python -m scalesgd.virtual --on-failure continue``):
the same recovery code as under ULFM (``train/survive.py``), over the in-process transport, which
kills a virtual rank (``SCALESGD_INJECT_FAULT=RANK:STEP:kill``, ``@checkpoint``, ``@evaluation``),
fails every later call that waits on it (as a revoked communicator does) and shrinks the job to
the survivors.  One process per run, a second or two each: every method, a death inside a step,
a checkpoint and an evaluation, and two deaths.  ``test_survival.py`` is the real-MPI check
(Open MPI's ULFM)."""
import subprocess

import numpy as np
import pytest

from helpers import final_arrays, node_profile, run_cli
from survival_checks import check_survived, records, summary
from synth import make_dataset

from scalesgd.io import checkpoint as ckpt

WORKERS = 4
ARGS = ["--width", "0.25", "--image-size", "16", "--scale", "16,20", "--batch-size", "4", "--epochs", "3",
        "--checkpoint-every", "0.5", "--keep-checkpoints", "20", "--log-every", "1", "--progress", "off",
        "--on-failure", "continue"]
# 96 training samples, 4 workers x batch 4: 6 steps per epoch, 18 in all; a checkpoint every 3 steps

METHODS = {"allreduce": ["allreduce"], "easgd": ["easgd"], "asgd": ["asgd"],
           "asgd-2-servers": ["asgd", "--servers", "2"], "gossip-pull": ["gossip", "--gossip", "pull"],
           "gossip-push-overlap": ["gossip", "--gossip", "push", "--gossip-overlap"],
           "localsgd": ["localsgd", "--tau", "2"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("vsurvival"), n=96, n_val=32, num_classes=4)


def virtual_run(data, run_dir, method: list[str], faults: str, *extra: str,
                workers: int = WORKERS) -> subprocess.CompletedProcess:
    return run_cli(["--method", *method, "--workers", str(workers), "--data", str(data), "--run-dir",
                    str(run_dir), *ARGS, *extra], run_dir.parent, 180, module="scalesgd.virtual",
                   env={"SCALESGD_INJECT_FAULT": faults})


def ok(p) -> None:
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-6000:]}"


def servers(method: list[str]) -> int:
    return 0 if method[0] not in ("easgd", "asgd") else int(method[2]) if "--servers" in method else 1


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_survives_a_worker_lost_in_a_step(data, tmp_path, name):
    """The last worker dies after its step 8: the others finish on the shrunk job, evaluate and
    checkpoint as its ranks; all-reduce's replicas are identical at the end, push-sum's weights
    sum to the survivors' count (the mass the dead rank held is renormalised away)."""
    method, run_dir = METHODS[name], tmp_path / "run"
    k = servers(method)
    dead = k + WORKERS - 1
    p = virtual_run(data, run_dir, method, f"{dead}:8:kill")
    ok(p)
    check_survived(run_dir, [dead], WORKERS - 1, ranks=k + WORKERS)
    assert f"rank(s) [{dead}] of the job died" in p.stderr
    latest = ckpt.latest_good(ckpt.checkpoint_dir(run_dir))
    if name == "allreduce":
        params = [ckpt.read_rank(latest, r)[1]["params"] for r in range(WORKERS - 1)]
        assert all(np.array_equal(params[0], q) for q in params[1:])
    if name == "gossip-push-overlap":
        weights = [ckpt.read_rank(latest, r, arrays=False)[2]["method"]["weight"] for r in range(WORKERS - 1)]
        assert sum(weights) == pytest.approx(WORKERS - 1, rel=1e-6)
        assert summary(run_dir)["failures"][0]["pushsum_weight_lost"] > 0
    if k:                                        # the servers served the workers left
        failure = summary(run_dir)["failures"][0]["global_samples"]
        served = {r["global_samples"]: r["served"] for r in records(run_dir, 0, "server")}
        assert max(served.values()) > max((v for g, v in served.items() if g <= failure), default=0)


@pytest.mark.parametrize("place", ["checkpoint", "evaluation"])
@pytest.mark.parametrize("name", ["allreduce", "easgd", "gossip-push-overlap"])
def test_a_worker_lost_inside_a_checkpoint_or_an_evaluation(data, tmp_path, name, place):
    """A worker dies inside the first checkpoint (or evaluation) after its step 8, while the others
    are in that phase's collectives: they survive, and the phase is done again by the survivors
    (every boundary is evaluated once, checkpoints after it are theirs)."""
    method, run_dir = METHODS[name], tmp_path / "run"
    k = servers(method)
    p = virtual_run(data, run_dir, method, f"{k + 1}:8:kill@{place}")
    ok(p)
    s = check_survived(run_dir, [k + 1], WORKERS - 1, ranks=k + WORKERS)
    assert s["history"][-1]["epoch"] == 3.0


@pytest.mark.parametrize("name", ["allreduce", "gossip-push-overlap", "localsgd"])
def test_two_workers_lost_one_after_the_other(data, tmp_path, name):
    """Rank 0 (the first worker: the step lines, the summary's writer) dies after step 5, rank 3
    after step 11: two recoveries; the last two ranks finish, rank 1 writes the summary and takes
    the step lines over."""
    method, run_dir = METHODS[name], tmp_path / "run"
    p = virtual_run(data, run_dir, method, "0:5:kill,3:11:kill", "--progress", "lines")
    ok(p)
    steps = [int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("step ")]
    assert steps and max(steps) > 11, p.stdout[-3000:]
    s = check_survived(run_dir, [0, 3], WORKERS - 2)
    assert [f["ranks"] for f in s["failures"]] == [[0], [3]]
    assert [f["workers"] for f in s["failures"]] == [3, 2]
    if name == "allreduce":
        params = final_arrays(run_dir)
        assert np.array_equal(params["rank-00000/params"], params["rank-00001/params"])


def test_a_lost_server_ends_the_job_naming_it(data, tmp_path):
    """EASGD's server (rank 0) dies: its center is gone, so the survivors end the job in one line."""
    run_dir = tmp_path / "run"
    p = virtual_run(data, run_dir, ["easgd"], "0:3:kill")
    assert p.returncode == 1, p.stderr[-3000:]
    assert "server rank(s) [0] died, and the center is gone" in p.stderr, p.stderr[-3000:]
    assert not (run_dir / "summary.json").exists()


def test_without_continue_a_killed_rank_ends_the_run_in_one_line(data, tmp_path):
    """On_failure = abort (the default): a killed virtual rank ends the run, naming it."""
    args = [a for a in ARGS if a not in ("--on-failure", "continue")]
    p = run_cli(["--method", "allreduce", "--workers", str(WORKERS), "--data", str(data), "--run-dir",
                 str(tmp_path / "run"), *args], tmp_path, 120, module="scalesgd.virtual",
                env={"SCALESGD_INJECT_FAULT": "1:4:kill"})
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "virtual rank 1 died" in p.stderr and not (tmp_path / "run" / "summary.json").exists()


HIERARCHICAL = {"easgd": ["easgd"], "asgd": ["asgd"],
                "gossip-push-overlap": ["gossip", "--gossip", "push", "--gossip-overlap"]}


@pytest.mark.parametrize("who", ["member", "leader"])
@pytest.mark.parametrize("name", list(HIERARCHICAL))
def test_node_groups_survive_a_lost_member_or_leader(data, tmp_path, name, who):
    """--hierarchy node, two ranks a node: a node group's member dies after its step 8 (its
    leader's node is then a group of one), or its leader (the member, once its copy, leads the
    group on).  The others finish in node groups, a node's replicas identical; push-sum's
    leaders' weights sum to their count (the new leader starts at weight 1, the lost weight is
    reported); a server serves the groups left."""
    method, run_dir = HIERARCHICAL[name], tmp_path / "run"
    k = servers(method)
    workers = 4 + k                    # groups {0, 1} {2, 3}; with a server {0} {1} {2, 3} {4, 5}
    ranks = k + workers
    dead = ranks - 2 if who == "leader" else ranks - 1       # (the last node's; {2, 3} or {0, 1} stay)
    p = virtual_run(data, run_dir, method, f"{dead}:8:kill", "--hierarchy", "node",
                    "--profile", node_profile(tmp_path), workers=workers)
    ok(p)
    s = check_survived(run_dir, [dead], workers - 1, ranks=ranks)
    assert s["history"][-1]["epoch"] == 3.0
    assert "(dist.hierarchy = node)" in p.stderr
    latest = ckpt.latest_good(ckpt.checkpoint_dir(run_dir))
    states = [ckpt.read_rank(latest, r)[1:] for r in range(ranks - 1)]
    groups = {}
    for r, (arrays, state) in enumerate(states):
        group = state["method"].get("node_group", [-1])
        if r >= k:
            groups.setdefault(tuple(group), []).append(arrays["params"])
    assert any(len(g) > 1 for g in groups.values()), groups.keys()
    for group, params in groups.items():     # a node's replicas: identical
        assert all(np.array_equal(params[0], q) for q in params[1:]), group
    if name == "gossip-push-overlap":
        weights = [st["method"]["weight"] for r, (_, st) in enumerate(states)
                   if st["method"].get("node_group", [None])[0] == r]
        assert sum(weights) == pytest.approx(len(weights), rel=1e-6)
        assert "pushsum_weight_lost" in s["failures"][0]


def test_local_sgd_node_groups_made_unequal_by_a_death_end_the_job_in_one_line(data, tmp_path):
    """Local SGD counts samples in lockstep and needs node groups of one size: after a member of
    one of two nodes of two died, the survivors end the job naming the death and the reason."""
    run_dir = tmp_path / "run"
    p = virtual_run(data, run_dir, ["localsgd", "--tau", "2"], "3:8:kill", "--hierarchy", "node",
                    "--profile", node_profile(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "rank(s) [3] died and the survivors cannot go on: dist.hierarchy = node: localsgd counts " \
           "samples in lockstep" in p.stderr, p.stderr[-3000:]
    assert not (run_dir / "summary.json").exists()
