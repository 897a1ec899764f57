"""``scalesgd doctor`` as a user runs it: real processes under the real mpiexec (1, 2 and 4 ranks), a
launch that makes every process a singleton, real shard directories (good, damaged, missing).

The checks run with a 2 MB all-reduce buffer and a 0.3-0.5 s busy target (hidden flags) instead of
25 MB and 1 s, to keep the tests short; nothing here asserts a speed."""
import json
import os
import re
import subprocess
import sys

import pytest
from mpirun import ROOT, check, run_mpi, uses_mpi
from synth import make_dataset

from scalesgd import doctor as D
from scalesgd.doctor.gpu import _ranges

FAST = ["--allreduce-mb", "2", "--busy-seconds", "0.3"]
GPU_ROWS = ("cupy / cuda", "cuda stack", "rank -> gpu", "nccl", "cuda-aware mpi", "cudnn frontend",
            "gpu fast paths", "dali gpu decode")
ROW = re.compile(r"^(\S.*?)\s{2,}(ok|warn|fail|n/a)\s{2,}(.*)$")
LAUNCH_VARS = ("PMI", "OMPI_", "PMIX", "SLURM", "MPI4PY", "MPIR_CVAR", "MPI_LOCAL", "HYDRA")


def has_gpu() -> bool:
    from scalesgd.backend import _try_cupy
    return _try_cupy()[0] is not None


def table_rows(stdout: str) -> list[tuple[str, str, str, str]]:
    """(name, status, result, fix) per row of the printed table ('' when no fix line follows)."""
    rows, lines = [], stdout.splitlines()
    for i, line in enumerate(lines):
        m = ROW.match(line)
        if m and m.group(1) != "check":
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            rows.append((*m.groups(), nxt[5:] if nxt.startswith("fix: ") else ""))
    return rows


def doctor_json(path) -> dict:
    doc = json.loads(path.read_text())
    assert doc["format"] == "scalesgd-doctor" and doc["format_version"] == 1
    return doc


def assert_table_is_json(stdout: str, doc: dict) -> dict:
    """Every printed row is the JSON's row, in order; returns {name: row}."""
    printed = table_rows(stdout)
    assert printed == [(c["name"], c["status"], c["result"], c["fix"]) for c in doc["checks"]], stdout
    assert [n for n, _ in D.CHECKS] == [c["name"] for c in doc["checks"]]
    assert all((c["status"] == "ok") == (c["fix"] == "") for c in doc["checks"]), doc["checks"]
    return {c["name"]: c for c in doc["checks"]}


@uses_mpi
def test_one_and_four_ranks_pass_with_gpu_rows_na_and_json_matching_the_table(tmp_path):
    data = make_dataset(tmp_path / "data", n=32, n_val=8, num_classes=4)
    for n in (1, 4):
        out = tmp_path / f"doctor-{n}.json"
        proc = run_mpi(n, ["-m", "scalesgd", "doctor", "--data", str(data), "--run-dir",
                           str(tmp_path / "runs"), "--json", str(out), *FAST], timeout=120)
        stdout = check(proc)
        doc = doctor_json(out)
        rows = assert_table_is_json(stdout, doc)
        assert doc["ok"] and doc["ranks"] == n and f"rows written to {out}" in stdout
        assert not [r for r in rows.values() if r["status"] == "fail"], stdout
        assert rows["launcher"]["result"].startswith(f"{n} rank{'s' * (n > 1)} in MPI_COMM_WORLD")
        assert rows["data (--data)"]["status"] == "ok" and "sha256 of all 3 shards" in stdout
        assert rows["dali cpu decode"]["status"] == "ok", rows["dali cpu decode"]
        if not has_gpu():
            assert all(rows[g]["status"] == "n/a" and rows[g]["result"].startswith("no GPU")
                       for g in GPU_ROWS), stdout
        rma = rows["one-sided progress"]
        if n == 1:
            assert rma["status"] == "n/a" and rows["allreduce in node"]["status"] == "n/a"
        else:                                   # one node here: measured within it, noisy, so ok or warn
            assert rma["status"] in ("ok", "warn") and rma["data"]["targets"] == {"same node": 1}
            assert set(rma["data"]["seconds"]["same node"]) == {"Get", "Accumulate", "Fetch_and_op"}
            assert rows["allreduce in node"]["data"]["ranks"] == 4
            assert rows["allreduce across nodes"]["status"] == "n/a"


@uses_mpi
def test_one_sided_calls_that_wait_for_a_busy_target_are_named_with_the_setting_that_fixes_it(tmp_path):
    """MPICH with MPIR_CVAR_NOLOCAL=1 treats every rank as on a node of its own (as across real
    nodes): Accumulate and Fetch_and_op then wait until the computing target enters MPI."""
    out = tmp_path / "doctor.json"
    proc = run_mpi(2, ["-m", "scalesgd", "doctor", "--run-dir", str(tmp_path), "--json", str(out),
                       "--allreduce-mb", "2", "--busy-seconds", "0.5"], env={"MPIR_CVAR_NOLOCAL": "1"})
    stdout = check(proc)
    rows = assert_table_is_json(stdout, doctor_json(out))
    if "MPICH" not in rows["mpi library"]["result"]:
        pytest.skip("MPIR_CVAR_NOLOCAL is MPICH's")
    rma = rows["one-sided progress"]
    assert rma["status"] == "warn" and rma["data"]["targets"] == {"other node": 1}, rma
    assert "Accumulate (other node)" in rma["result"] and "Fetch_and_op (other node)" in rma["result"]
    assert "MPIR_CVAR_ASYNC_PROGRESS=1" in rma["fix"]
    assert rows["allreduce across nodes"]["status"] in ("ok", "warn")      # measured: 2 "nodes"
    assert rows["allreduce across nodes"]["data"]["nodes"] == 2
    per_node = rows["ranks per node"]                  # mpiexec's MPI_LOCALNRANKS says 2 on one host
    assert per_node["status"] == "warn" and "put 2 ranks there (MPI_LOCALNRANKS)" in per_node["result"]


def clean_env(**extra) -> dict:
    """This environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    return dict(env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"), **extra)


def mpi_library() -> str:
    """MPI_Get_library_version of the library mpi4py loads here (MPI not initialised)."""
    p = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False\n"
                        "from mpi4py import MPI; print(MPI.Get_library_version())"],
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    return p.stdout


def start_doctor(args, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scalesgd", "doctor", *FAST, *args], cwd=ROOT,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_launch_of_singletons_is_a_failed_row_and_exit_1_not_a_hang(tmp_path):
    """Separate processes told by a launcher's variables that they are ranks of one job (what a
    wrong srun --mpi plugin or another MPI's mpiexec produces): the one numbered 0 reports the
    launch as a failed row, the others exit 1 silently, none waits for the others.  MPICH under
    Open MPI's launcher variables is reported without starting MPI (MPI_Init would abort)."""
    cases = {"hydra-0": dict(PMI_SIZE="2", PMI_RANK="0"), "hydra-1": dict(PMI_SIZE="2", PMI_RANK="1"),
             "srun-0": dict(SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="0", SLURM_STEP_ID="0")}
    needles = {"hydra-0": ["PMI_SIZE=2", "promised 2 ranks", "MPI_COMM_WORLD has 1"],
               "srun-0": ["SLURM_STEP_NUM_TASKS=2", "promised 2 ranks", "--mpi=pmi2"]}
    if "MPICH" in mpi_library():
        cases["ompi-0"] = dict(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0")
        needles["ompi-0"] = ["OMPI_COMM_WORLD_SIZE=2", "MPI4PY_MPIABI=openmpi"]
    procs = {name: start_doctor(["--run-dir", str(tmp_path), "--json", str(tmp_path / f"{name}.json")],
                                clean_env(**env)) for name, env in cases.items()}
    done = {name: (*p.communicate(timeout=120), p.returncode) for name, p in procs.items()}
    for name, (stdout, stderr, rc) in done.items():
        assert rc == 1 and "Traceback" not in stderr, (name, rc, stdout, stderr)
    assert done["hydra-1"][0] == "" and not (tmp_path / "hydra-1.json").exists()
    for name in needles:
        doc = doctor_json(tmp_path / f"{name}.json")
        rows = assert_table_is_json(done[name][0], doc)
        launcher = rows["launcher"]
        assert not doc["ok"] and launcher["status"] == "fail", done[name][0]
        assert all(n in launcher["result"] + launcher["fix"] for n in needles[name]), launcher
    if "ompi-0" in cases:                               # refused before MPI_Init: no MPI row measured
        rows = {c["name"]: c for c in doctor_json(tmp_path / "ompi-0.json")["checks"]}
        assert rows["mpi library"]["result"].endswith("MPI not started"), rows["mpi library"]
        assert rows["one-sided progress"]["result"] == "MPI did not start (see the launcher row)"


def test_a_bad_data_dir_or_run_dir_fails_its_row(tmp_path):
    """One plain process per case, all at once: a missing directory, a sample with garbage
    compressed data, a shard whose bytes changed after the manifest was written; and a run
    directory below a file."""
    make_dataset(tmp_path / "garbage", n=32, n_val=8, num_classes=4, garbage=1)
    changed = make_dataset(tmp_path / "changed", n=32, n_val=8, num_classes=4)
    manifest = json.loads((changed / "manifest.json").read_text())
    shard = changed / manifest["splits"]["train"]["shards"][1]["file"]
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    (tmp_path / "a-file").write_text("")
    cases = {"missing": (tmp_path / "nowhere", tmp_path / "a-file" / "runs"),
             "garbage": (tmp_path / "garbage", tmp_path / "runs"),
             "changed": (changed, tmp_path / "runs")}
    procs = {name: start_doctor(["--data", str(d), "--run-dir", str(r), "--json",
                                 str(tmp_path / f"{name}.json")], clean_env())
             for name, (d, r) in cases.items()}
    done = {name: (*p.communicate(timeout=120), p.returncode) for name, p in procs.items()}
    needles = {"missing": "nowhere/manifest.json: manifest not found",
               "garbage": "train-00000-of-00002.h5[1]: Corrupt JPEG data",
               "changed": f"{shard.name}: sha256"}
    for name, (stdout, stderr, rc) in done.items():
        assert rc == 1, (name, stdout, stderr)
        rows = assert_table_is_json(stdout, doctor_json(tmp_path / f"{name}.json"))
        assert rows["data (--data)"]["status"] == "fail" and needles[name] in rows["data (--data)"]["result"]
        assert rows["launcher"]["status"] == "ok"
        assert rows["run dir disk"]["status"] == ("fail" if name == "missing" else "ok"), rows["run dir disk"]
    assert "a-file is not a directory" in table_rows(done["missing"][0])[-1][2]


def test_pure_parts_and_usage_errors():
    assert D.slurm_tasks_on_node("4(x2),3", 0) == 4 and D.slurm_tasks_on_node("4(x2),3", 2) == 3
    assert D.slurm_tasks_on_node("4(x2),3", 3) is None and D.slurm_tasks_on_node("x", 0) is None
    assert D.rma_targets([0, 0, 2, 2]) == {"same node": 1, "other node": 2}
    assert D.rma_targets([0, 1]) == {"other node": 1} and D.rma_targets([0]) == {}
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert D.bus_gbs(25_000_000, 2, 0.025) == pytest.approx(1.0)        # 2(p-1)/p = 1 for p = 2
    assert "MPIR_CVAR_ASYNC_PROGRESS=1" in D.progress_fix("MPICH Version: 5.0.2")
    assert "I_MPI_ASYNC_PROGRESS=1" in D.progress_fix("Intel(R) MPI Library 2021.10")
    assert "OMPI_MCA_btl_tcp_progress_thread=1" in D.progress_fix("Open MPI v5.0.11")
    table = D.render([D.Check("a", "ok", "fine"), D.Check("longer name", "fail", "bad", "do this")], "head")
    assert table.splitlines() == ["head", "check        status  result", "a            ok      fine",
                                  "longer name  fail    bad", "                     fix: do this",
                                  "1 ok, 0 warn, 1 fail, 0 n/a"]
    p = subprocess.run([sys.executable, "-m", "scalesgd", "doctor", "--bogus"], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == \
        "scalesgd doctor: error: unrecognized arguments: --bogus (see --help)", p.stderr


def test_the_cuda_stack_row_names_each_part_s_cuda_and_a_mix(monkeypatch):
    """Issue 38: which CUDA CuPy, cuDNN, NCCL and DALI were built for, against the driver's, from
    made-up facts (``installed()`` and ``loaded()`` as a CUDA 13 node would report them); and a
    cuDNN frontend whose library does not load is a reported error, not the row's end."""
    from types import SimpleNamespace

    from scalesgd.doctor import stack
    from scalesgd.doctor.gpu import _backend

    def wheel(comp, cuda):
        name = {"cupy": f"cupy-cuda{cuda}x", "cudnn": f"nvidia-cudnn-cu{cuda}",
                "nccl": f"nvidia-nccl-cu{cuda}", "dali": f"nvidia-dali-cuda{cuda}0"}[comp]
        return [{"wheel": name, "version": "1.0", "cuda": cuda}]
    lib = {"driver": 13000, "runtime": 13000, "cupy": "14.2.0", "cudnn": 92700, "nccl": 22703}
    same = {c: wheel(c, 13) for c in ("cupy", "cudnn", "nccl", "dali")}
    status, text, fix = stack.verdict(same, lib)
    assert status == "ok" and fix == "" and text.startswith("CUDA driver 13.0; CuPy 14.2.0 (CUDA 13), "
                                                            "cuDNN 9.27.0 (CUDA 13), NCCL 2.27.3 (CUDA 13)")
    status, text, fix = stack.verdict({**same, "dali": wheel("dali", 12)}, lib)    # the old default
    assert status == "warn" and "CUDA 12: DALI (nvidia-dali-cuda120)" in text and ".[cuda13]" in fix
    status, text, fix = stack.verdict(same, {**lib, "driver": 12080})               # too old a driver
    assert status == "fail" and "needs CUDA 13, the driver runs up to 12.8" in text and ".[cuda12]" in fix
    assert stack.verdict({"cupy": wheel("cupy", 12) + wheel("cupy", 13)}, {})[0] == "warn"
    status, text, _ = stack.verdict({"dali": wheel("dali", 12)}, {})                 # this CPU machine
    assert status == "ok" and text.startswith("CuPy absent, cuDNN absent, NCCL absent, DALI 1.0 (CUDA 12)")

    def broken():
        raise OSError("libcudnn.so.9: cannot open shared object file")
    assert _backend(SimpleNamespace(backend_version=broken)) == "backend not loaded: OSError"
    monkeypatch.setattr("scalesgd.nn.cudnn_conv.probe_cudnn",
                        lambda: SimpleNamespace(backend_version=broken))
    assert "libcudnn.so.9" in stack.loaded(None)["cudnn_error"]


@uses_mpi
def test_a_check_that_does_not_finish_ends_the_job_naming_it(tmp_path):
    """The deadline (hidden --deadline, 300 s by default): a target computing far longer than the
    deadline stands for a rank that stopped answering; the job ends, it does not wait."""
    proc = run_mpi(2, ["-m", "scalesgd", "doctor", "--run-dir", str(tmp_path), "--deadline", "4",
                       "--busy-seconds", "30", "--allreduce-mb", "1"], timeout=60)
    check(proc, expect_ok=False)
    assert re.search(r"scalesgd doctor: error \(rank \d/2\): '[a-z -]+' did not finish within 4 s",
                     proc.stderr), proc.stderr
    assert "ending the job" in proc.stderr and not (tmp_path / "doctor.json").exists()
