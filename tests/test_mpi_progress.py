"""``dist.mpi_progress`` (comm/progress.py): what keeps a rank's MPI progressing so that one-sided
calls aimed at it never wait for its compute.  The plan for every setting, the environment of
``mpi``, the thread's life; under real mpiexec, the thread removing the wait on MPICH's network
path (``MPIR_CVAR_NOLOCAL=1``: peers on this node are treated as remote), gossip training with each
setting, the one-line warning without MPI_THREAD_MULTIPLE; in the virtual cluster, blocking gossip
across nodes no longer waiting for its busy peers."""
import json
import threading
import time

import pytest

from helpers import TINY, run_cli
from mpirun import check, mpi_launcher, needs_mpi, open_mpi, run_mpi
from synth import make_dataset
from test_virtual import ok, virtual

from scalesgd.comm import progress
from scalesgd.comm.progress import ASYNC_ENV, ProgressThread, plan


def _plan(setting="auto", **kw):
    args = dict(one_sided=True, spans_nodes=True, overlap=False, thread_level="multiple")
    args.update(kw)
    return plan(setting, 2.0, 0.005, **args)


def test_plan_per_setting_and_situation():
    assert _plan().mechanism == "thread" and _plan().interval == 0.002     # across nodes: a thread
    assert _plan(spans_nodes=False).mechanism == "none"                    # one node: nothing changes
    assert _plan("thread", spans_nodes=False).mechanism == "thread"
    assert _plan(overlap=True).mechanism == "courier" and _plan(overlap=True).interval == 0.005
    assert _plan(overlap=True, spans_nodes=False).mechanism == "none"
    assert _plan("none").mechanism == "none" and "wait" in _plan("none").why
    assert _plan("mpi").mechanism == "mpi" and "'funneled'" in _plan("mpi", thread_level="funneled").warning
    assert _plan("mpi", one_sided=False).mechanism == "none"
    assert _plan(one_sided=False).mechanism == "none"                      # two-sided methods
    for s in ("auto", "thread"):
        p = _plan(s, thread_level="serialized")                            # degrades with one line
        assert p.mechanism == "none" and "'serialized'" in p.warning and "\n" not in p.warning
        assert "--mpi-progress mpi" in p.warning
    assert not _plan("auto", thread_level="serialized", spans_nodes=False).warning
    for s in ("auto", "thread", "none", "mpi"):
        assert not _plan(s).warning and _plan(s).describe()


def test_prepare_sets_the_libraries_async_progress_only_for_mpi_and_keeps_a_users_value():
    env = {"MPIR_CVAR_ASYNC_PROGRESS": "0"}
    assert progress.prepare("auto", "gossip", env) == [] and env == {"MPIR_CVAR_ASYNC_PROGRESS": "0"}
    assert progress.prepare("mpi", "allreduce", env) == []          # only gossip is a target
    added = progress.prepare("mpi", "gossip", env)
    assert env["MPIR_CVAR_ASYNC_PROGRESS"] == "0" and "MPIR_CVAR_ASYNC_PROGRESS" not in added
    assert {k: env[k] for k in added} == {k: v for k, v in ASYNC_ENV.items() if k in added} and added


def test_more_ranks_than_cpus_make_waiting_ranks_yield_and_a_users_value_is_kept():
    """prepare_waiting reads the node's rank count from the launcher (MPICH, Open MPI, srun) and
    asks both libraries to let a waiting rank sleep only when the node has more ranks than CPUs."""
    from scalesgd.comm.mpi.library import local_size
    assert local_size({"MPI_LOCALNRANKS": "4"}) == 4 and local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}) == 3
    slurm = {"SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_STEP_NUM_NODES": "4", "SLURM_JOB_NUM_NODES": "4"}
    assert [local_size({**slurm, "SLURM_NODEID": str(i)}) for i in range(4)] == [2, 2, 2, 1]
    assert local_size({**slurm, "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "2"}) is None   # a step on part
    assert local_size({}) is None \
        and local_size({"SLURM_STEP_TASKS_PER_NODE": "x", "SLURM_NODEID": "0"}) is None
    for ranks, cpus in ((2, 2), (8, 16), (None, 1)):
        env = {} if ranks is None else {"MPI_LOCALNRANKS": str(ranks)}
        assert progress.prepare_waiting(env, cpus) == "" and set(env) <= {"MPI_LOCALNRANKS"}
    env = {"MPI_LOCALNRANKS": "4"}
    line = progress.prepare_waiting(env, 2)
    assert env == {"MPI_LOCALNRANKS": "4", **progress.YIELD_ENV} \
        and line.startswith("4 ranks on this node's 2 CPUs")
    import os
    n = os.cpu_count() or 1               # under Slurm: the job's CPUs on the node, when fewer
    assert progress.prepare_waiting({"MPI_LOCALNRANKS": str(n), "SLURM_CPUS_ON_NODE": str(n)}) == ""
    assert progress.prepare_waiting({"MPI_LOCALNRANKS": "2", "SLURM_CPUS_ON_NODE": "1"}).startswith(
        "2 ranks on this node's 1 CPU:")
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}
    assert "kept MPIR_CVAR_ENABLE_HEAVY_YIELD=0 as given" in progress.prepare_waiting(env, 2)
    assert env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "0" and env["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_the_thread_pokes_until_closed_and_ends_on_an_error():
    calls = []
    t = ProgressThread(lambda: calls.append(time.perf_counter()), 0.002)
    deadline = time.monotonic() + 10                         # (a loaded machine may start it late)
    while len(calls) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.close()
    n = len(calls)
    assert n >= 10 and t.pokes == n and t.error is None
    time.sleep(0.05)
    assert len(calls) == n                                   # closed: no more pokes
    t.close()                                                # idempotent

    def dead():
        raise RuntimeError("MPI_ERR_PROC_FAILED")
    t = ProgressThread(dead, 0.001)
    t._thread.join(10)                                       # it ends by itself on the error
    assert isinstance(t.error, RuntimeError) and not [th for th in threading.enumerate()
                                                      if th is t._thread and th.is_alive()]
    t.close()


@pytest.mark.mpi
@needs_mpi
def test_the_progress_thread_removes_the_wait_for_a_busy_target():
    """MPICH with every peer treated as remote: without progress, Accumulate and Fetch_and_op on a
    rank computing for 1 s outside MPI wait for it (the control: this path really needs the
    target's progress); with the progress thread each completes in a fraction of that."""
    if open_mpi():                          # (known from the launcher: no job started to learn it)
        pytest.skip("needs MPICH's MPIR_CVAR_NOLOCAL to take the network path on one node (Open MPI)")
    busy = 1.0
    out = check(run_mpi(2, ["tests/mpi/progress_check.py", str(busy)], timeout=60,
                        env={"MPIR_CVAR_NOLOCAL": "1"}))
    r = json.loads(out.strip().splitlines()[-1])
    if "MPICH" not in r["library"]:
        pytest.skip(f"needs MPICH's MPIR_CVAR_NOLOCAL to take the network path on one node ({r['library']})")
    assert r["thread_level"] == "multiple"
    waited = {op: s for op, s in r["none"].items() if s > 0.25 * busy}
    assert waited, f"control: no op waited for the busy target without progress: {r}"
    assert all(s < 0.25 * busy for s in r["thread"].values()), r
    assert r["thread_pokes"] > 0 and r["none_pokes"] == 0


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("tiny"), n=48, n_val=20, num_classes=4)


@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("setting,variant", [("thread", "pull"), ("mpi", "push"), ("none", "push")])
def test_gossip_trains_with_each_setting(tmp_path, tiny_data, setting, variant):
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(run_dir), "--method", "gossip",
                 "--gossip", variant, "--mpi-progress", setting, *TINY], tmp_path, timeout=90,
                launcher=mpi_launcher(2))
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert json.loads((run_dir / "summary.json").read_text())["workers"] == 2
    said = [ln for ln in p.stderr.splitlines() if "MPI progress" in ln]
    expected = {"thread": ["a progress thread (MPI_Iprobe every 2 ms): dist.mpi_progress = thread"],
                "mpi": ["the MPI library's asynchronous progress: dist.mpi_progress = mpi (set before "
                        "MPI_Init)"], "none": []}[setting]
    assert said == [f"scalesgd: gossip: MPI progress: {e}" for e in expected], p.stderr


@pytest.mark.mpi
@needs_mpi
def test_without_thread_multiple_one_warning_and_the_run_goes_on(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv("MPI4PY_RC_THREAD_LEVEL", "serialized")
    run_dir = tmp_path / "run"
    p = run_cli(["--data", str(tiny_data), "--run-dir", str(run_dir), "--method", "gossip",
                 "--mpi-progress", "thread", *TINY], tmp_path, timeout=90, launcher=mpi_launcher(2))
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    warned = [ln for ln in (p.stdout + p.stderr).splitlines() if "mpi_progress" in ln]
    assert len(warned) == 1 and "'serialized'" in warned[0], p.stderr
    assert (run_dir / "summary.json").exists()


@pytest.fixture(scope="module")
def vdata(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("vdata"), n=96, n_val=16, num_classes=4)


def test_virtual_blocking_gossip_across_nodes_waits_only_without_progress(vdata, tmp_path):
    """One rank per virtual node, one-sided calls waiting for a computing target (the profile's
    ``rma_progress = target``): with the default (a progress thread) a pull run's wait is a small
    fraction of what it is with ``--mpi-progress none``; same method code, simulated time."""
    def wait_seconds(setting):
        d = tmp_path / setting
        ok(virtual(["--method", "gossip", "--gossip", "pull", "--workers", "4", "--data", str(vdata),
                    *TINY, "--epochs", "2", "--profile", "titanx-fdr-resnet18", "--mpi-progress",
                    setting, "--run-dir", str(d)], tmp_path))
        last = [[json.loads(x) for x in (d / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()
                 if '"kind": "step"' in x][-1] for r in range(4)]
        return sum(row["wait_seconds"] for row in last)
    none, auto = wait_seconds("none"), wait_seconds("auto")
    assert none > 0 and auto < 0.25 * none, (none, auto)
