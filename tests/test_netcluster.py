"""The emulated cluster (benchmarks/netcluster.py): real network namespaces, veth links into a
bridge, tbf qdiscs, and real mpiexec across them.  Needs root and iproute2; skipped with the tool's
one-line reason otherwise.  Every test names its own prefix and checks afterwards that nothing of
it is left: namespaces, links, the bridge, processes and the job's /dev/shm segments."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, TINY
from synth import make_dataset


import netcluster as nc  # noqa: E402

from scalesgd.comm import shm  # noqa: E402

MISSING = nc.requirements_missing()
# marked mpi too, so that `make test-openmpi` runs them under Open MPI ($MPIEXEC picks the launcher)
pytestmark = [pytest.mark.netcluster, pytest.mark.mpi,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
TOOL = [sys.executable, str(ROOT / "benchmarks" / "netcluster.py")]
METHODS = [["--method", "allreduce"], ["--method", "easgd"], ["--method", "asgd", "--n-sync", "2"],
           ["--method", "gossip", "--gossip", "pull"], ["--method", "gossip", "--gossip", "push"],
           ["--method", "localsgd", "--tau", "2"]]
# Flat across nodes, push-sum alone (its one-sided inboxes and progress thread: no other test runs
# them flat across nodes; flat all-reduce trains across nodes in the two-level test below and EASGD's
# server ports in test_experiments' extensions sweep); with --hierarchy node every method (its
# leaders use them all).  The same kill and resume of every method, flat, runs on one node in
# test_resume.py.
FLAT = [METHODS[4]]
HANG = """import pathlib, sys, time
from mpi4py import MPI
pathlib.Path(sys.argv[1], f"up-{MPI.COMM_WORLD.Get_rank()}").touch()
if MPI.COMM_WORLD.Get_rank() == 0:
    time.sleep(600)                 # outside MPI: rank 1 waits in the barrier until the job is stopped
MPI.COMM_WORLD.Barrier()
"""


def tagged(tag: str) -> list[int]:
    """PIDs of live processes whose environment holds NETCLUSTER_TEST_TAG=tag."""
    pids, needle = [], f"NETCLUSTER_TEST_TAG={tag}".encode()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture
def prefix(request):
    """A cluster prefix of this test's own; afterwards nothing of it may exist.  A test that failed
    half-way still gets its leftovers reported here, then removed for the next; what a killed run
    left (no teardown ran) is removed before the test, with a warning, unless a live process holds it."""
    name = "sgdt" + uuid.uuid5(uuid.NAMESPACE_DNS, request.node.name).hex[:4]
    removed = nc.reclaim(name)
    if removed:
        warnings.warn(f"removed what an earlier, killed run left: {', '.join(removed)}", stacklevel=1)
    yield name
    left = nc.leftovers(name)
    nc.teardown(name)                   # also kills whatever still runs inside its namespaces
    assert left == [], left


def wait_for(paths, proc, timeout=60):
    """Polls until every path exists; fails early if ``proc`` ended."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"not all of {paths} within {timeout} s"
        time.sleep(0.05)


def test_allreduce_runs_at_the_link_rate_and_its_bytes_cross_the_links(prefix):
    """2 nodes at 200 Mbit/s both ways (25 MB/s): a 4 MB all-reduce's bus bandwidth is within 30% of
    the rate, and each node's NIC sent and received at least the 4 x 4 MB that each rank moves (a
    2-rank all-reduce sends and receives the whole buffer once); the hostnames are node0, node1,
    and with one CPU per node the ranks run on CPUs 0 and 1 (or both on 0 on a 1-CPU machine)."""
    # (6 repeats of 0.16 s, the best one judged: one CPU per node is shared with the other test
    # worker's jobs, and a sender descheduled for a few ms stops filling the link)
    size, repeats, rate = 4_000_000, 6, 200e6 / 8
    with nc.NetCluster(2, rate="200mbit", prefix=prefix, cpus_per_node=1) as c:
        res = c.run([sys.executable, str(ROOT / "tests/mpi/netcluster_allreduce.py"), str(size),
                     str(repeats)], capture=True, timeout=120)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["hosts"] == ["node0", "node1"], out
    assert out["cpus"] == [[0], [1 % os.cpu_count()]], out
    busbw = out["busbw"]
    # Open MPI's all-reduce over its TCP BTL reached 48-90% of the link here (median 62%; its
    # Send/Recv 87-97%), so for it the lower bound is looser; the bytes are checked alike.  The
    # link reaches its rate in the best repeat and never beats it (a repeat the shared machine
    # slowed says nothing about the link)
    low = 0.7 if nc.mpi_flavor(nc.default_mpiexec()) == "mpich" else 0.4
    assert low * rate <= max(busbw) and max(busbw) <= 1.3 * rate, (busbw, out, res.traffic)
    moved = size * (repeats + 1)
    for node, t in res.traffic.items():
        assert moved <= t.sent <= 1.2 * moved + 2e6, (node, t)      # + headers, PMI, connections
        assert moved <= t.received <= 1.2 * moved + 2e6, (node, t)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tiny"), n=48, n_val=20, num_classes=4)


def run_killed_then_resumed(c, flags, run_dir, env, tiny_data):
    """Starts a 2-epoch run of ``flags`` on the cluster (a checkpoint every half epoch, every rank
    slowed by 250 ms a step so that the kill lands mid-run), SIGKILLs its newest rank process once
    the first checkpoint exists, and checks that the job ended by itself within 60 s of the kill
    (non-zero, no summary, not stopped by the tool's timeout), that no rank survived, and that
    /dev/shm holds no MPI segment it did not hold before (the tool, like slurm/run.sh after a
    failed step, removes what the killed ranks could not); returns the resumed job's result, which
    must have resumed from a checkpoint of the killed run."""
    from helpers import rank_pids, ranks_left
    from scalesgd.io import checkpoint as ckpt
    argv = [sys.executable, "-m", "src.main", "--data", str(tiny_data), "--run-dir", str(run_dir), *TINY,
            "--batch-size", "2", "--epochs", "2", "--checkpoint-every", "0.5", "--progress", "off",
            "--straggler", "0,1,2,3,4,5:250", *flags]
    before = nc._mpi_segments()
    box = {}

    def job_body():
        try:
            box["res"] = c.run(argv, env=env, cwd=ROOT, capture=True, timeout=120)
        except BaseException as exc:               # re-raised below, in the test's thread
            box["exc"] = exc
    job = threading.Thread(target=job_body)
    job.start()
    deadline = time.monotonic() + 90
    while not (ckpt.checkpoint_dir(run_dir).is_dir() and ckpt.listing(ckpt.checkpoint_dir(run_dir))):
        assert job.is_alive(), f"{flags}: ended before its first checkpoint: {box}"
        assert time.monotonic() < deadline, f"{flags}: no checkpoint within 90 s"
        time.sleep(0.02)
    pids = sorted(rank_pids(str(run_dir)))
    assert len(pids) == 6, (flags, pids)
    os.kill(pids[-1], signal.SIGKILL)
    killed_at = time.monotonic()
    job.join(timeout=150)
    assert not job.is_alive(), f"{flags}: the tool did not return after the kill"
    if "exc" in box:
        raise box["exc"]
    killed = box["res"]
    assert not killed.timed_out and time.monotonic() - killed_at < 60, \
        f"{flags}: the job did not end by itself after the kill\n{killed.stderr}"
    assert killed.returncode != 0 and not (run_dir / "summary.json").exists(), \
        f"{flags}: rc={killed.returncode}\n{killed.stderr}"
    assert ranks_left(str(run_dir)) == [], f"{flags}: ranks survived the kill"
    left = (nc._mpi_segments() - before) - shm.in_use()    # (a job of another test, running
    assert not left, (flags, left)                            # beside this one, maps its own)
    kept = ckpt.listing(ckpt.checkpoint_dir(run_dir))
    resumed = c.run([sys.executable, "-m", "src.main", "--resume", str(run_dir), "--straggler", "0:0"],
                    env=env, cwd=ROOT, capture=True, timeout=120)
    assert any(f"resuming from {k}" in resumed.stderr for k in kept), (flags, kept, resumed.stderr)
    return resumed


@pytest.mark.parametrize("hierarchy", ["none", "node"])
def test_every_method_trains_resumes_after_a_kill_and_leaves_nothing_on_three_nodes(
        tmp_path, tiny_data, prefix, hierarchy):
    """Issue 24's acceptance: allreduce, easgd, asgd, gossip pull and push, local SGD (tau 2, so that
    evaluations and checkpoints also fall between two averages, where a node's ranks must still
    agree on the leader's count), on 3 nodes x 2 ranks (1 Gbit/s), with ``--hierarchy node``, and
    flat for push-sum (``FLAT``: trimmed twice to keep the suite under 10 minutes, from every
    method to one a protocol, then to the one no other test runs flat across nodes) (with the
    hierarchy a node's replicas are identical at the end, and differ across nodes under EASGD,
    A-SGD and pull gossip).  Each run is SIGKILLed in one rank
    after its first checkpoint: the whole job ends by itself (non-zero, no summary), no rank
    survives and no MPI segment is left in /dev/shm.  Resumed from that run's checkpoint, it
    finishes its 2 epochs on 6 ranks with every rank's metrics, and every node's NIC carried at
    least a model's worth of bytes each way.  Across nodes gossip runs its progress thread.  One
    CPU per node: one BLAS thread per rank."""
    from helpers import final_arrays
    env = {"OMP_NUM_THREADS": "1", "SCALESGD_DATA": str(tmp_path / "digits")}
    with nc.NetCluster(3, rate="1gbit", prefix=prefix, ranks_per_node=2, cpus_per_node=1) as c:
        for flags in (METHODS if hierarchy == "node" else FLAT):
            flags = [*flags, "--hierarchy", hierarchy]
            run_dir = tmp_path / "-".join(flags[1::2])
            res = run_killed_then_resumed(c, flags, run_dir, env, tiny_data)
            assert res.returncode == 0, f"{flags}: resume rc={res.returncode}\n{res.stdout}\n{res.stderr}"
            summary = json.loads((run_dir / "summary.json").read_text())
            assert summary["ranks"] == 6 and summary["history"][-1]["epoch"] == 2.0, summary
            assert sorted(p.name for p in (run_dir / "metrics").iterdir()) == \
                [f"rank-{r}.jsonl" for r in range(6)]
            model_bytes = 4 * summary["num_params"]
            for node, t in res.traffic.items():
                assert min(t.sent, t.received) >= model_bytes, (flags, node, t, model_bytes)
            if flags[1] == "asgd":       # its default rate: the base over those who push (config.json)
                lr = json.loads((run_dir / "config.json").read_text())["schedule"]["lr"]
                assert lr == pytest.approx(0.1 / (3 if hierarchy == "node" else 5)), (hierarchy, lr)
            if "gossip" in flags:        # across nodes, by default, a progress thread (comm/progress.py)
                assert "gossip: MPI progress: a progress thread" in res.stderr, res.stderr
            if hierarchy == "node":
                assert "(dist.hierarchy = node)" in res.stderr, res.stderr
                p = final_arrays(run_dir)
                p = {r: p[f"rank-{r:05d}/params"] for r in range(6) if f"rank-{r:05d}/params" in p}
                # a node's replicas are identical: ranks 2k and 2k+1, except the server's node, where
                # rank 0 is a group of its own (EASGD, A-SGD keep no params file for it) and so is rank 1
                pairs = [(2, 3), (4, 5)] if "easgd" in flags or "asgd" in flags else [(0, 1), (2, 3), (4, 5)]
                for a, b in pairs:
                    assert np.array_equal(p[a], p[b]), (flags, a, b)
                # nodes differ under the asynchronous methods (local SGD: its last step averages).
                # Not under push-sum: when two leaders' last pushes cross, the final drain leaves
                # each with half of both, (x_a + x_b) / 2 over (w_a + w_b) / 2, bit for bit the
                # same; there the leaders-only exchange (the 2-node test) shows the hierarchy
                if flags[1] in ("easgd", "asgd") or flags[1:4] == ["gossip", "--gossip", "pull"]:
                    assert not np.array_equal(p[2], p[4]), flags


def test_doctor_across_two_nodes_reports_the_progress_mechanism_ok(tmp_path, prefix):
    """`scalesgd doctor` on 2 emulated nodes: the raw one-sided row may show waiting (nothing
    progresses a computing target), the 'progress mechanism' row runs the probe again with the
    progress thread that a gossip run would start, and is ok (MPICH; under Open MPI a slow
    Accumulate is a warning naming its one-sided component)."""
    out = tmp_path / "doctor.json"
    # ok = every call under a quarter of the target's busy time (doctor.base.RMA_WAITED); 0.5 s
    # (125 ms) failed under load, and so did doctor's default second (250 ms) once while both cores
    # ran other jobs: 2 s leaves 500 ms for delays of the shared CPU
    busy = 2.0
    with nc.NetCluster(2, rate="1gbit", prefix=prefix, cpus_per_node=1) as c:
        res = c.run([sys.executable, "-m", "src.main", "doctor", "--busy-seconds", str(busy),
                     "--allreduce-mb", "1", "--run-dir", str(tmp_path), "--json", str(out)],
                    cwd=ROOT, capture=True, timeout=180)
    rows = {r["name"]: r for r in json.loads(out.read_text())["checks"]}
    row = rows["progress mechanism"]
    assert row["data"]["mechanism"] == "thread" and set(row["data"]["seconds"]) == \
        {"Get", "Accumulate", "Fetch_and_op"}, row
    if nc.mpi_flavor(nc.default_mpiexec()) == "mpich":
        assert row["status"] == "ok", (row, res.stdout, res.stderr)
    else:       # Open MPI over TCP: Get is served, its accumulates stay slow (measured: 0.6 s)
        assert row["data"]["seconds"]["Get"] < 0.25 * busy, row
        assert row["status"] == "ok" or "osc/rdma" in row["fix"], row


def test_leftovers_are_refused_and_a_failing_body_tears_down(prefix):
    """`up` from the command line leaves a cluster; a second one with the same prefix is refused
    with the cleaning command; `down` removes it; an exception inside the context manager tears
    its cluster down and propagates."""
    up = subprocess.run([*TOOL, "up", "2", "--rate", "100mbit", "--prefix", prefix],
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert len(nc.leftovers(prefix)) == 5                 # 2 namespaces, 2 bridge ports, the bridge
    with pytest.raises(nc.NetClusterError, match=f"benchmarks/netcluster.py down --prefix {prefix}'"):
        nc.NetCluster(2, prefix=prefix).up()
    assert nc.NetCluster.attach(prefix).nodes == 2
    down = subprocess.run([*TOOL, "down", "--prefix", prefix], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and "removed 5" in down.stdout, down.stdout + down.stderr
    with pytest.raises(RuntimeError, match="boom"):
        with nc.NetCluster(2, rate="100mbit", prefix=prefix):
            assert len(nc.leftovers(prefix)) == 5
            raise RuntimeError("boom")
    assert nc.leftovers(prefix) == []


HOLD = """import sys, time
sys.path.insert(0, {bench!r})
import netcluster as nc
with nc.NetCluster(2, rate="100mbit", prefix={prefix!r}):
    print("up", flush=True)
    time.sleep(600)
"""


def test_a_killed_holders_cluster_is_taken_over_a_live_ones_is_not(prefix, capfd):
    """A cluster records the process whose `with` holds it.  While that process runs, a second
    cluster under its prefix is refused and ``reclaim`` refuses too; once it was SIGKILLed (no
    teardown ran: a CI job killed mid-test left one, and every later run failed on it), it counts
    as ended even before it is reaped (a zombie), and the next ``up`` removes what it left, says so,
    and goes on.  A cluster that ``up`` left on purpose records no holder: ``up`` still refuses it,
    and ``reclaim`` (a prefix of the caller's own) removes it."""
    proc = subprocess.Popen([sys.executable, "-c",
                             HOLD.format(bench=str(ROOT / "benchmarks"), prefix=prefix)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert nc.holder_state(prefix) == ("alive", f"pid {proc.pid}")
        with pytest.raises(nc.NetClusterError, match=f"down --prefix {prefix}'"):
            nc.NetCluster(2, prefix=prefix).up()
        with pytest.raises(nc.NetClusterError, match=f"in use by pid {proc.pid}, which still runs"):
            nc.reclaim(prefix)
        proc.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert nc.holder_state(prefix) == ("ended", f"pid {proc.pid}")      # a zombie has ended
    finally:
        proc.kill()
        proc.wait()
    assert len(nc.leftovers(prefix)) == 5
    capfd.readouterr()
    with nc.NetCluster(2, rate="100mbit", prefix=prefix):
        assert nc.holder_state(prefix) == ("alive", f"pid {os.getpid()}")
    assert f"removed 5 namespace(s)/link(s) that pid {proc.pid}, which has ended" in capfd.readouterr().err
    assert nc.leftovers(prefix) == []
    up = subprocess.run([*TOOL, "up", "2", "--rate", "100mbit", "--prefix", prefix],
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    assert nc.holder_state(prefix) == ("none", "no holder recorded")
    with pytest.raises(nc.NetClusterError, match="leftovers of an earlier cluster"):
        nc.NetCluster(2, prefix=prefix).up()
    assert len(nc.reclaim(prefix)) == 5 and nc.leftovers(prefix) == []


# The holder keeps the cluster until the other one was refused (a flag file; at most 60 s), not for
# a fixed time: on a loaded machine the other could start after a fixed wait was over, find nothing,
# build its own, and the test read two "intact"s.
RACE = """import sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
import netcluster as nc
flag = Path({flag!r})
try:
    with nc.NetCluster(2, rate="100mbit", prefix={prefix!r}):
        t = time.monotonic()
        while not flag.exists() and time.monotonic() - t < 60:
            time.sleep(0.05)
        print("intact" if len(nc.leftovers({prefix!r})) == 5 else "broken", flush=True)
except nc.NetClusterError:
    flag.touch()
    print("refused", flush=True)
"""


def test_two_that_find_a_killed_holders_cluster_at_once_do_not_break_each_other(prefix, tmp_path):
    """Two processes start a cluster under the same prefix at once, over what a killed holder
    left: one takes it over and keeps it whole while it holds it, the other is refused (a lock per
    prefix spans the look, the removal and the build)."""
    dead = subprocess.Popen([sys.executable, "-c",
                             HOLD.format(bench=str(ROOT / "benchmarks"), prefix=prefix)],
                            stdout=subprocess.PIPE, text=True)
    assert dead.stdout.readline().strip() == "up"
    dead.kill()
    dead.wait()
    code = RACE.format(bench=str(ROOT / "benchmarks"), prefix=prefix, flag=str(tmp_path / "refused"))
    both = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = sorted(p.communicate(timeout=120)[0].strip() for p in both)
    assert outs == ["intact", "refused"], outs
    assert nc.leftovers(prefix) == []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_the_job_and_removes_everything(tmp_path, prefix, sig, code):
    """`run --nodes 2` with rank 0 asleep outside MPI: after SIGINT (Ctrl-C) or SIGTERM to the tool,
    no rank survives, the namespaces and links are gone, and so are the /dev/shm segments the
    ranks had mapped (killed ranks never reach MPI_Finalize, which would remove them).  The tool is
    started with SIGINT ignored, as a shell's background job (`cmd &`) inherits it: it must still
    stop on one (it once hung in waitpid here, when the suite ran in the background)."""
    tag = uuid.uuid4().hex
    (tmp_path / "hang.py").write_text(HANG)
    err_file = tmp_path / "tool.err"
    with err_file.open("w") as err_out:      # a file, not a pipe: a stuck job cannot hold it open
        proc = subprocess.Popen([*TOOL, "run", "--nodes", "2", "--rate", "100mbit", "--prefix", prefix,
                                 "--", sys.executable, str(tmp_path / "hang.py"), str(tmp_path)],
                                env=dict(os.environ, NETCLUSTER_TEST_TAG=tag), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err_out, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for([tmp_path / "up-0", tmp_path / "up-1"], proc)     # both ranks passed MPI_Init
        segments = set().union(*(shm.mapped_files(p) for p in tagged(tag)))
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)        # the tool's stacks (faulthandler) say where it hung
            time.sleep(1)
            pytest.fail(f"the tool did not end within 60 s of signal {sig}; its stacks:\n"
                        f"{err_file.read_text()[-6000:]}")
    finally:
        proc.kill()
        proc.wait()
    err = err_file.read_text()
    assert proc.returncode == code, err
    assert tagged(tag) == [], "processes of the job survived"
    if nc.mpi_flavor(nc.default_mpiexec()) == "mpich":
        assert segments, "MPICH's ranks map a /dev/shm segment each, even with NOLOCAL"
    assert not any(p.exists() for p in segments), segments
    assert nc.leftovers(prefix) == []


def test_missing_root_or_tc_is_one_line(tmp_path):
    """Without root (a user namespace maps us to nobody) or without tc on PATH: one line, exit 1,
    and the same line is what these tests are skipped with."""
    no_root = subprocess.run(["unshare", "--user", *TOOL, "up", "2", "--rate", "1gbit"],
                             capture_output=True, text=True, timeout=60)
    assert (no_root.returncode, no_root.stderr) == (1, "netcluster: needs root (network namespaces, "
                                                       "veth pairs and tc qdiscs)\n")
    for tool in ("ip", "unshare"):                            # a PATH with iproute2's ip only
        (tmp_path / tool).symlink_to(nc.shutil.which(tool))
    no_tc = subprocess.run([*TOOL, "up", "2", "--rate", "1gbit"], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, PATH=str(tmp_path)))
    assert (no_tc.returncode, no_tc.stderr) == (1, "netcluster: needs 'tc' (iproute2) on PATH\n")
    bad = subprocess.run([*TOOL, "up", "2", "--rate", "1gbs"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "bad rate '1gbs'" in bad.stderr


def test_the_two_level_allreduce_sends_fewer_bytes_across_nodes(tmp_path, tiny_data, prefix):
    """2 nodes x 2 ranks (membership from MPI's shared-memory split): all-reduce with
    ``--hierarchy node`` trains and logs 2 nodes of 2 ranks.  Under Open MPI, whose all-reduce is
    not node-aware, its busiest node sends far fewer bytes over its link than with the flat
    all-reduce (one copy of each bucket per node crosses, not one per rank: 14.9 -> 11.5 MB
    measured in this test's epoch, evaluation and checkpoint included; 28.6 -> 18.3 MB over 2);
    MPICH 5's own all-reduce already is node-aware, so there it must only cost no more.
    Run with -s to see the bytes."""
    env = {"OMP_NUM_THREADS": "1", "SCALESGD_DATA": str(tmp_path / "digits")}
    sent = {}
    with nc.NetCluster(2, rate="1gbit", prefix=prefix, ranks_per_node=2, cpus_per_node=1) as c:
        for hier in ("none", "node"):
            run_dir = tmp_path / hier
            res = c.run([sys.executable, "-m", "src.main", "--data", str(tiny_data), "--run-dir",
                         str(run_dir), *TINY, "--width", "1", "--batch-size", "2",
                         "--method", "allreduce", "--hierarchy", hier],
                        env=env, cwd=ROOT, capture=True, timeout=120)
            assert res.returncode == 0, f"{hier}: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
            assert json.loads((run_dir / "summary.json").read_text())["ranks"] == 4
            sent[hier] = max(t.sent for t in res.traffic.values())
            if hier == "node":
                assert "two-level (dist.hierarchy = node): 2 node(s) of up to 2 rank(s)" in res.stderr
    print(f"bytes sent by the busiest node, flat vs two-level: {sent}")
    if nc.mpi_flavor(nc.default_mpiexec()) == "mpich":
        assert sent["node"] <= 1.05 * sent["none"] + 1e6, sent     # (+ TCP acknowledgements,
                                                                       # retransmits: timing)
    else:
        assert sent["node"] < 0.9 * sent["none"], sent


@pytest.mark.parametrize("method", ["asgd", "localsgd"])
def test_hierarchical_runs_resume_on_more_ranks_from_the_saved_leaders(tmp_path, tiny_data, prefix, method):
    """``--hierarchy node`` on 2 nodes x 2 resumed on 2 nodes x 3: every new worker continues a
    saved group leader's state (a member's is not the method's).  A-SGD (the server alone, worker
    groups of 1 and 2, then 2 and 3): the workers start from the master; local SGD (groups of 2,
    then 3): from the mean of the saved leaders' replicas.  At lr 0 nothing moves them (zero
    pushes; averaging equal replicas), so the final checkpoint holds exactly that on every rank."""
    from helpers import final_arrays
    env = {"OMP_NUM_THREADS": "1", "SCALESGD_DATA": str(tmp_path / "digits")}
    run_dir = tmp_path / method
    with nc.NetCluster(2, rate="1gbit", prefix=prefix, ranks_per_node=2, cpus_per_node=1) as c:
        res = c.run([sys.executable, "-m", "src.main", "--data", str(tiny_data), *TINY, "--batch-size", "4",
                     "--method", method, "--hierarchy", "node", "--progress", "off", "--run-dir",
                     str(run_dir)], env=env, cwd=ROOT, capture=True, timeout=120)
        assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        saved = final_arrays(run_dir)
        if method == "asgd":
            want = saved["rank-00000/params"]                                  # the master
        else:
            want = ((saved["rank-00000/params"].astype(np.float64) + saved["rank-00002/params"]) / 2
                    ).astype(np.float32)
        res = c.run([sys.executable, "-m", "src.main", "--resume", str(run_dir), "--epochs", "2",
                     "--lr", "0"], env=env, cwd=ROOT, capture=True, timeout=120, layout=[3, 3])
        assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    groups = "3 group(s) of 1/2/3 rank(s)" if method == "asgd" else "2 group(s) of 3 rank(s)"
    assert "written by 4 ranks, on 6" in res.stderr and groups in res.stderr, res.stderr
    assert "master moves" not in res.stderr, res.stderr     # (asgd: 2 worker groups push, as before)
    got = final_arrays(run_dir)
    for r in range(6):
        np.testing.assert_array_equal(got[f"rank-{r:05d}/params"], want, err_msg=f"rank {r}")


def test_hierarchical_gossip_keeps_a_nodes_replicas_identical_and_resumes(tmp_path, tiny_data, prefix):
    """2 nodes x 2 ranks, overlapped push-sum gossip with ``--hierarchy node`` (the most state to
    carry: inboxes, weights, exchanges in flight): the ranks of a node average gradients and
    only their leaders gossip.  It trains, only the leaders exchange, its checkpoint holds identical
    replicas within each node, and it resumes to a longer run; a resume onto another split of the
    same 4 ranks (3 + 1) and one onto 6 ranks start every rank from the saved leaders' average.
    (Every other method with the hierarchy: the 3-node test above.)"""
    from helpers import final_arrays
    env = {"OMP_NUM_THREADS": "1", "SCALESGD_DATA": str(tmp_path / "digits")}
    common = ["--data", str(tiny_data), *TINY, "--width", "1", "--batch-size", "2", "--method",
              "gossip", "--gossip", "push", "--gossip-overlap"]
    with nc.NetCluster(2, rate="1gbit", prefix=prefix, ranks_per_node=2, cpus_per_node=1) as c:
        res = c.run([sys.executable, "-m", "src.main", *common, "--run-dir", str(tmp_path / "node"),
                     "--hierarchy", "node"], env=env, cwd=ROOT, capture=True, timeout=120)
        assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        arrays = final_arrays(tmp_path / "node")
        p = [arrays[f"rank-{r:05d}/params"] for r in range(4)]
        assert np.array_equal(p[0], p[1]) and np.array_equal(p[2], p[3]), "a node's replicas differ"
        # (the two nodes may end identical: if the leaders' last pushes cross, the final drain
        # leaves each with half of both; that the nodes train apart shows in who exchanges, below)
        res = c.run([sys.executable, "-m", "src.main", "--resume", str(tmp_path / "node"), "--epochs", "2"],
                    env=env, cwd=ROOT, capture=True, timeout=120)
        assert res.returncode == 0, f"resume: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        h = json.loads((tmp_path / "node" / "summary.json").read_text())["history"]
        assert h[-1]["epoch"] == 2.0, h
        # only the leaders (ranks 0 and 2) gossip; the bytes a run moves vary with how many steps
        # its asynchronous ranks take, so the byte cut is measured by benchmarks/hierarchy.py
        for r in range(4):
            steps = [json.loads(x) for x in (tmp_path / "node" / "metrics" / f"rank-{r}.jsonl")
                     .read_text().splitlines() if '"kind": "step"' in x]
            assert (steps[-1].get("gossip_exchanges", 0) > 0) == (r % 2 == 0), (r, steps[-1])
        # the same 4 ranks split 3 + 1 into nodes: the checkpoint's node groups differ, so every
        # rank continues a saved leader, as on another rank count (at lr 0 from the leaders' average)
        import shutil  # noqa: PLC0415
        split = tmp_path / "split"
        shutil.copytree(tmp_path / "node", split)
        res = c.run([sys.executable, "-m", "src.main", "--resume", str(split), "--epochs", "3", "--lr", "0"],
                    env=env, cwd=ROOT, capture=True, timeout=120, layout=[3, 1])
        assert res.returncode == 0, f"split: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        assert "written by 4 ranks, on 4 split into other node groups" in res.stderr, res.stderr
        assert json.loads((split / "summary.json").read_text())["history"][-1]["epoch"] == 3.0
        # on 6 ranks (2 nodes x 3): every rank starts from the saved leaders' average, sum w x / sum w
        # (members hold copies: not counted), and at lr 0 nothing moves it (mixing equal replicas)
        from scalesgd.io import checkpoint as ckpt
        saved = final_arrays(tmp_path / "node")
        meta_path = ckpt.listing(ckpt.checkpoint_dir(tmp_path / "node"))[-1]
        weights = {r: ckpt.read_rank(meta_path, r)[2]["method"].get("weight") for r in (0, 2)}
        want = sum(w * saved[f"rank-{r:05d}/params"].astype(np.float64) for r, w in weights.items()) \
            / sum(weights.values())
        res = c.run([sys.executable, "-m", "src.main", "--resume", str(tmp_path / "node"), "--epochs", "3",
                     "--lr", "0"], env=env, cwd=ROOT, capture=True, timeout=120, layout=[3, 3])
        assert res.returncode == 0, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
        assert "written by 4 ranks, on 6" in res.stderr, res.stderr
        got = final_arrays(tmp_path / "node")
        for r in range(6):
            np.testing.assert_allclose(got[f"rank-{r:05d}/params"], want, rtol=1e-5, atol=1e-6)
        assert json.loads((tmp_path / "node" / "summary.json").read_text())["ranks"] == 6
