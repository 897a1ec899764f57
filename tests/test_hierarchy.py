"""``dist.hierarchy = "node"`` (comm/mpi/hierarchy.py): the two-level all-reduce against the flat sum
under real mpiexec (ranks grouped as 2 + 2 and 3 + 1), the configurations it refuses, and training
with it: replicas identical, a resumed run bitwise identical to an uninterrupted one.  Across
emulated nodes (fewer bytes on the links than the flat all-reduce): tests/test_netcluster.py."""
import json

import numpy as np
import pytest

from helpers import TINY, final_arrays, launch, one_line_error, run_cli
from mpirun import check, needs_mpi, run_mpi
from synth import make_dataset

from scalesgd import config as C


def test_hierarchy_is_refused_where_it_is_not_built():
    assert C.build(None, {}).dist.hierarchy == "none"
    C.build(None, {"train": {"method": "allreduce"}, "dist": {"hierarchy": "node"}})
    C.build(None, {"train": {"method": "gossip"}, "dist": {"hierarchy": "node"}})
    C.build(None, {"train": {"method": "gossip", "on_failure": "continue"}, "dist": {"hierarchy": "node"}})
    with pytest.raises(C.ConfigError, match="all-reduce's two-level sum cannot survive a lost rank"):
        C.build(None, {"train": {"method": "allreduce", "on_failure": "continue"},
                       "dist": {"hierarchy": "node"}})
    for method in ("localsgd", "easgd", "asgd"):
        C.build(None, {"train": {"method": method}, "dist": {"hierarchy": "node"}})
    with pytest.raises(C.ConfigError, match="dist.allreduce_transport = nccl"):
        C.build(None, {"train": {"method": "allreduce"},
                       "dist": {"hierarchy": "node", "allreduce_transport": "nccl"}})


@pytest.mark.mpi
@needs_mpi
def test_two_level_sum_equals_the_flat_sum_on_every_rank():
    out = check(run_mpi(4, ["tests/mpi/hierarchy_check.py"], timeout=90))
    assert out.count(": ok") == 4, out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("hier"), n=48, n_val=16, num_classes=4)


def _args(data, run_dir, epochs):
    return ["--data", str(data), "--method", "allreduce", "--hierarchy", "node", *TINY,
            "--batch-size", "4", "--epochs", str(epochs), "--checkpoint-every", "0.5",
            "--keep-checkpoints", "10", "--run-dir", str(run_dir), "--progress", "off",
            "--cosine-epochs", "2"]


@pytest.mark.mpi
@needs_mpi
def test_training_replicas_stay_identical_and_a_resume_is_bitwise(tmp_path, data):
    whole, part = tmp_path / "whole", tmp_path / "part"
    p = run_cli(_args(data, whole, 2), tmp_path, timeout=120, launcher=launch(3))
    assert p.returncode == 0, p.stderr
    assert "allreduce: two-level (dist.hierarchy = node): 1 node(s) of up to 3 rank(s)" in p.stderr
    fa = final_arrays(whole)
    params = [fa[f"rank-{r:05d}/params"] for r in range(3) if f"rank-{r:05d}/params" in fa]
    assert params and all(np.array_equal(params[0], x) for x in params)
    p = run_cli(_args(data, part, 1), tmp_path, timeout=120, launcher=launch(3))
    assert p.returncode == 0, p.stderr
    p = run_cli(["--resume", str(part), "--epochs", "2"], tmp_path, timeout=120, launcher=launch(3))
    assert p.returncode == 0, p.stderr
    fb = final_arrays(part)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
    h = [json.loads((d / "summary.json").read_text())["history"] for d in (whole, part)]
    assert [r["val_top1_accuracy"] for r in h[0]] == [r["val_top1_accuracy"] for r in h[1]]


@pytest.mark.mpi
@needs_mpi
def test_gossip_on_one_node_is_one_line(tmp_path, data):
    p = run_cli(["--data", str(data), "--method", "gossip", "--hierarchy", "node", *TINY,
                 "--run-dir", str(tmp_path / "run2")], tmp_path, timeout=60, launcher=launch(2))
    one_line_error(p, "dist.hierarchy = node", "one node")


@pytest.mark.mpi
@needs_mpi
def test_asgd_with_a_hierarchy_serves_one_group_per_node(tmp_path, data):
    """3 ranks on one node: the server alone, ranks 1 and 2 one group whose leader (rank 1) talks
    to the server; the group's replicas stay identical and the server served its pushes."""
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(data), "--method", "asgd", "--hierarchy", "node", *TINY, "--batch-size", "4",
                 "--run-dir", str(run_dir), "--progress", "off"], tmp_path, timeout=120, launcher=launch(3))
    assert p.returncode == 0, p.stderr
    fa = final_arrays(run_dir)
    assert np.array_equal(fa["rank-00001/params"], fa["rank-00002/params"])
    rows = [json.loads(x) for x in (run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    served = [r for r in rows if r["kind"] == "server"]
    assert served and served[-1]["served"] > 0, served


def test_a_reshaped_resume_continues_each_node_group_from_one_saved_leader():
    """``resuming.source_rank`` for a checkpoint of node groups: every rank of new worker group g
    (its leader's rank among the leaders, less the servers) continues saved worker leader g mod
    their count, so the new groups take distinct saved leaders in order and a member never takes a
    state of its own; servers continue themselves.  Saved: a server (rank 0) and worker groups led by
    ranks 1 and 2 (2 x 2 nodes); new: 2 x 3 nodes, groups {1, 2} and {3, 4, 5}; and 3 groups of 2."""
    from types import SimpleNamespace as NS

    from scalesgd.train.resuming import source_rank

    def src(rank, group_index, servers=1, leaders=(0, 1, 2)):
        s = NS(topo=NS(rank=rank, size=6), roles=NS(num_servers=servers, is_server=rank < servers),
               method=NS(node_split=NS(group_index=group_index)))
        return source_rank(s, 4, leaders=list(leaders))
    assert [src(r, g) for r, g in [(0, 0), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]] == [0, 1, 1, 2, 2, 2]
    # gossip (no server), saved leaders 0 and 2; new: 3 nodes of 2, groups 0, 1, 2
    assert [src(r, r // 2, servers=0, leaders=(0, 2)) for r in range(6)] == [0, 0, 2, 2, 0, 0]
