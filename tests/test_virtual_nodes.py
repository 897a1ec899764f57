"""``--hierarchy node`` in the virtual cluster: node groups from the profile (``virtual/nodes.py``), the
two-level all-reduce's sum and time (``virtual/allreduce.py``), every method training in node
groups with a node's replicas identical, re-timing such a run bit for bit, and the refusals
(a replay, a re-timing on another node size).  In-process: the virtual cluster needs no MPI."""
import json
import types

import numpy as np
import pytest

from helpers import final_arrays, node_profile
from synth import make_dataset
from test_retime import same_run, vrun

from scalesgd.comm.topology import Topology
from scalesgd.errors import ConfigError
from scalesgd.virtual import profile as P
from scalesgd.virtual import retime as R
from scalesgd.virtual import run as VR
from scalesgd.virtual.allreduce import VirtualTwoLevelAllreducer, tree_sum
from scalesgd.virtual.cluster import Cluster
from scalesgd.virtual.nodes import worker_nodes
from scalesgd.virtual.transport import InProcessTransport
from scalesgd.virtual.world import World


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ndata"), n=96, n_val=16, num_classes=4)


def in_world(size, rpn, body, **prof):
    """Runs ``body(net)`` as every rank of a bare virtual world (no training); their results."""
    world = World(size)
    cluster = Cluster(world, P.Profile("p", ranks_per_node=rpn, **prof))
    out = [None] * size

    def main(r):
        def go():
            out[r] = body(InProcessTransport(cluster, tuple(range(size)), r))
        return go
    world.run([main(r) for r in range(size)])
    return out, world


def test_node_groups_are_the_profiles_nodes_with_servers_alone():
    """6 ranks, 2 a node, rank 0 serving: groups {0} {1} {2,3} {4,5}, as MPITransport.node_groups
    makes them (a server alone, the rest of its node a group without it); every field of the
    NodeSplit, the sub-transports' ranks, and the worker-node count (Topology's and run.py's)."""
    def body(net):
        s = net.node_groups(alone=net.rank < 1)
        topo = Topology(net.rank, net.size, 0, 1, None, None, net)
        return (s.node.group, s.leaders.group if s.leaders else None, s.leader_rank, s.group_index,
                s.sizes, s.is_leader, topo.worker_nodes(1))
    got, _ = in_world(6, 2, body)
    lead = (0, 1, 2, 4)
    assert got[0] == ((0,), lead, 0, 0, (1, 1, 2, 2), True, 3)
    assert got[1] == ((1,), lead, 1, 1, (1, 1, 2, 2), True, 3)
    assert got[2] == ((2, 3), lead, 2, 2, (1, 1, 2, 2), True, 3)
    assert got[3] == ((2, 3), None, 2, 2, (1, 1, 2, 2), False, 3)
    assert got[5] == ((4, 5), None, 4, 3, (1, 1, 2, 2), False, 3)
    assert worker_nodes(6, 1, 2) == 3 and worker_nodes(6, 0, 2) == 3 and worker_nodes(7, 0, 3) == 3
    got, _ = in_world(7, 3, lambda net: (net.node_groups().sizes, net.node_split().group))
    assert [g for g, _ in got] == [(3, 3, 1)] * 7
    assert [n for _, n in got] == [(0, 1, 2)] * 3 + [(3, 4, 5)] * 3 + [(6,)]


def test_the_two_level_sum_is_the_nodes_then_the_leaders_on_every_rank_and_its_time():
    """6 ranks, 3 a node: every rank ends with the same bytes, ((x0 + x1) + x2) + ((x3 + x4) + x5)
    (each node by MPICH's pairing, then the leaders'), the flat sum to rounding but not its bits
    (the flat order is ((x0 + x1) + (x2 + x3)) + (x4 + x5)); every rank's clock is the node's
    reduce, the leaders' ring, the node's broadcast."""
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(4096) * 10.0 ** rng.integers(-3, 4, 4096)).astype(np.float32)
          for _ in range(6)]
    dist = types.SimpleNamespace(overlap=False, hierarchy="node")

    def body(net):
        flat = xs[net.rank].copy()
        red = net.allreducer(flat, None, dist)
        assert isinstance(red, VirtualTwoLevelAllreducer)
        red.finish()
        return flat
    prof = dict(link_gbps=1.0, latency_us=30, intra_gbps=50)
    got, world = in_world(6, 3, body, **prof)
    want = ((xs[0] + xs[1]) + xs[2]) + ((xs[3] + xs[4]) + xs[5])
    for r in range(6):
        assert got[r].tobytes() == want.tobytes(), r
    flat = tree_sum(xs)
    assert not np.array_equal(want, flat)
    np.testing.assert_allclose(want, flat, rtol=1e-5, atol=1e-6 * np.abs(xs).max())
    b = xs[0].nbytes
    intra = 2 * (2 / 3) * b / (50e9 / 8)
    leaders = 2 * (1 / 2) * b / (1e9 / 8) + 2 * 30e-6
    assert world.clock[:6] == pytest.approx([intra + leaders] * 6, rel=1e-12)


def comm_per_step(run_dir, rank=0):
    rows = [json.loads(x) for x in (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]
    comm = [x["comm_seconds"] for x in rows if x.get("kind") == "step"]
    return (comm[-1] - comm[0]) / (len(comm) - 1)


def test_the_two_level_all_reduce_adds_the_intra_node_stages_to_the_leaders_ring(data, tmp_path):
    """8 workers, 4 a node (2 nodes), no overlap: per step the flat all-reduce costs the ring over
    the 2 nodes (node-aware, as MPICH's), the two-level one the same ring among the 2 leaders plus
    the node's reduce and broadcast at the intra-node rate, 2 (k - 1)/k bytes / intra_gbps: more
    than the flat one by exactly that, and less than a ring over the 8 ranks that ignores the
    nodes (2 (p - 1) (bytes / p / link + latency))."""
    prof = node_profile(tmp_path, "four-a-node", ranks_per_node=4, link_gbps=2.0, intra_gbps=20)
    runs = {h: vrun(["--method", "allreduce", "--workers", "8", "--no-overlap", "--profile", prof,
                     "--hierarchy", h], tmp_path / h, data) for h in ("none", "node")}
    per = {h: comm_per_step(d) for h, d in runs.items()}
    b = 4 * json.loads((runs["node"] / "summary.json").read_text())["num_params"]
    ring = 2 * (1 / 2) * b / (2e9 / 8) + 2 * 30e-6
    stages = 2 * (3 / 4) * b / (20e9 / 8)
    assert per["none"] == pytest.approx(ring, rel=1e-9)
    assert per["node"] == pytest.approx(ring + stages, rel=1e-9)
    assert per["none"] < per["node"] < 2 * 7 * (b / 8 / (2e9 / 8) + 30e-6)
    print(f"comm per step, flat / two-level / rank ring: {per['none']:.3e} / {per['node']:.3e} / "
          f"{2 * 7 * (b / 8 / (2e9 / 8) + 30e-6):.3e} s")


METHODS = {"allreduce": ["--method", "allreduce", "--workers", "6"],
           "easgd": ["--method", "easgd", "--workers", "5"],
           "asgd": ["--method", "asgd", "--workers", "5"],
           "gossip-pull": ["--method", "gossip", "--gossip", "pull", "--workers", "6"],
           "localsgd": ["--method", "localsgd", "--tau", "2", "--workers", "6"]}


@pytest.mark.parametrize("case", list(METHODS))
def test_every_method_trains_in_node_groups_and_a_nodes_replicas_stay_identical(case, data, tmp_path, caplog):
    """6 ranks, 2 a node, ``--hierarchy node`` (the emulated-cluster test's invariants,
    tests/test_netcluster.py): every rank trains 2 epochs; a node's replicas are identical at
    the end (ranks 2k, 2k + 1; under EASGD and A-SGD rank 0 serves alone and keeps no params, and
    rank 1 is a group of its own); nodes differ under EASGD, A-SGD and pull gossip; A-SGD's
    default rate is over the 3 worker node groups."""
    caplog.set_level("INFO", logger="scalesgd")
    run_dir = vrun([*METHODS[case], "--hierarchy", "node", "--profile", node_profile(tmp_path)],
                   tmp_path / "run", data)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks"] == 6 and summary["history"][-1]["epoch"] == 2.0, summary["history"]
    assert "(dist.hierarchy = node)" in caplog.text, caplog.text
    p = final_arrays(run_dir)
    p = {r: p[f"rank-{r:05d}/params"] for r in range(6) if f"rank-{r:05d}/params" in p}
    server = case in ("easgd", "asgd")
    for a, b in [(2, 3), (4, 5)] if server else [(0, 1), (2, 3), (4, 5)]:
        assert np.array_equal(p[a], p[b]), (case, a, b)
    if case in ("easgd", "asgd", "gossip-pull"):
        assert not np.array_equal(p[2], p[4]), case
    if case == "allreduce":
        assert all(np.array_equal(p[0], p[r]) for r in range(6))
    if case == "asgd":
        lr = json.loads((run_dir / "config.json").read_text())["schedule"]["lr"]
        assert lr == pytest.approx(0.1 / 3), lr


RETIMED = {"allreduce-overlap": ["--method", "allreduce", "--workers", "4", "--overlap"],
           "localsgd": ["--method", "localsgd", "--workers", "4", "--tau", "2"]}


@pytest.mark.parametrize("case", list(RETIMED))
def test_a_retimed_hierarchical_run_equals_a_full_run_under_that_profile(case, data, tmp_path):
    """A ``--hierarchy node`` run (2 nodes of 2) re-timed under another profile of 2 ranks a node
    (host MPI, typical noise) equals a full virtual run there, every metrics row and the summary,
    bit for bit; on a profile of another node size it is refused in one line."""
    args = [*RETIMED[case], "--hierarchy", "node"]
    src = vrun([*args, "--profile", node_profile(tmp_path)], tmp_path / "src", data)
    other = node_profile(tmp_path, "host-two", link_gbps=0.5, latency_us=50, intra_gbps=20, step_seconds=0.03,
                    allreduce_progress="host", host_allreduce_factor=1.7, variability="typical")
    out = tmp_path / "rt"
    assert VR.main(["retime", str(src), "--profile", other, "--run-dir", str(out)]) == 0
    full = vrun([*args, "--profile", other], tmp_path / "full", data)
    same_run(out, full, 4)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (src, out))
    assert a["train_seconds"] != b["train_seconds"]
    with pytest.raises(ConfigError, match="2 rank.s. per node cannot be re-timed on 1 per node"):
        R.retime(src, P.load("a100-100gbit"), P.condition_of(P.load("a100-100gbit")), tmp_path / "no")


def test_a_hierarchical_run_is_not_replayed(data, tmp_path, capsys):
    """``--replay`` of a ``--hierarchy node`` run stops with one line before it writes anything."""
    src = vrun(["--method", "allreduce", "--workers", "2", "--hierarchy", "node"], tmp_path / "src", data)
    assert VR.main(["--replay", str(src), "--run-dir", str(tmp_path / "replay")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
    assert len(err) == 1 and "--hierarchy node run cannot be replayed exactly" in err[0], err
    assert not (tmp_path / "replay").exists()
    # a flag a replay cannot honour is refused, not silently dropped
    assert VR.main(["--replay", str(src), "--epochs", "3", "--workers", "8", "--threads", "1"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("scalesgd: error")]
    assert len(err) == 1 and "--epochs, --workers cannot change it" in err[0], err


def test_a_broadcast_inside_a_node_is_timed_at_the_intra_node_rate():
    """A node's leader hands its parameters to the node's ranks (the node groups of gossip, local
    SGD, EASGD, A-SGD) in a broadcast: one transfer at ``intra_gbps`` inside a node; across nodes at
    the link rate (it was charged the link rate everywhere: a node agent paid a second network
    transfer for each exchange)."""
    b = np.zeros(1 << 16, np.float32)
    prof = dict(link_gbps=1.0, latency_us=30, intra_gbps=50)

    def inside(net):
        node = net.node_split()
        t0 = net.clock()
        node.broadcast(b.copy(), 0)
        return net.clock() - t0
    got, _ = in_world(4, 2, inside, **prof)
    small = got[0] - b.nbytes / (50e9 / 8)
    assert 0 <= small < 1e-4 and got == pytest.approx([got[0]] * 4)

    def across(net):
        t0 = net.clock()
        net.broadcast(b.copy(), 0)
        return net.clock() - t0
    got, _ = in_world(4, 2, across, **prof)
    assert got[0] - b.nbytes / (1e9 / 8) == pytest.approx(small, abs=1e-4)
