"""A launch that turns every rank into a singleton is refused: the launcher's environment promises
more ranks than COMM_WORLD has (wrong srun --mpi plugin, another MPI's mpiexec, two MPI wheels in one
venv).  The real program is started with a launcher's variables set and no launcher, which is
exactly what such a rank sees; the message logic is also checked on its own for every launcher."""
import os
import subprocess
import sys

import pytest

from helpers import ROOT, TINY
from synth import make_dataset

from scalesgd.comm.mpi.library import check_library, check_world
from scalesgd.errors import TopologyError

MPICH = "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 2026\n"
OPENMPI = "Open MPI v5.0.11, package: Open MPI user Distribution, ident: 5.0.11, repo rev: v5.0.11\n"
LAUNCH_VARS = ("PMI", "OMPI_", "PMIX", "SLURM", "MPI4PY")


def clean_env(**extra) -> dict:
    """This environment without any launcher's variables (the tests may run under one), plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCH_VARS)}
    return dict(env, OMP_NUM_THREADS="1", **extra)


def library_family() -> str:
    p = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False\n"
                        "from mpi4py import MPI; print(MPI.Get_library_version())"],
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    return "openmpi" if "Open MPI" in p.stdout else "mpich"


def test_the_program_refuses_a_launch_that_promised_more_ranks(tmp_path):
    """Each case is one real process of the real program; the one the launcher numbered 0 prints one
    line naming the variable, both sizes and the fix, the others exit 1 silently; nothing is written."""
    data = make_dataset(tmp_path / "data", n=32, n_val=8, num_classes=4)
    cases = {"hydra": dict(PMI_SIZE="4", PMI_RANK="0"),
             "hydra-rank-3": dict(PMI_SIZE="4", PMI_RANK="3"),
             "srun": dict(SLURM_STEP_NUM_TASKS="4", SLURM_PROCID="0", SLURM_STEP_ID="0", SLURM_NTASKS="4")}
    if library_family() == "mpich":       # MPICH under Open MPI's launcher: refused before MPI_Init
        cases["openmpi-launcher"] = dict(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0")
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "src.main", "--data", str(data), *TINY, "--run-dir", str(tmp_path / name)],
        cwd=ROOT, env=clean_env(**env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for name, env in cases.items()}
    out = {name: (p.communicate(timeout=120), p.returncode) for name, p in procs.items()}
    needles = {"hydra": ["PMI_SIZE=4", "promised 4 ranks", "MPI_COMM_WORLD has 1"],
               "srun": ["SLURM_STEP_NUM_TASKS=4", "promised 4 ranks", "MPI_COMM_WORLD has 1", "--mpi=pmi2"],
               "openmpi-launcher": ["OMPI_COMM_WORLD_SIZE=2", "MPICH", "MPI4PY_MPIABI=openmpi"]}
    for name, ((stdout, stderr), rc) in out.items():
        assert rc == 1, (name, rc, stdout, stderr)
        errors = [ln for ln in stderr.splitlines() if ln.startswith("scalesgd: error")]
        if name == "hydra-rank-3":
            assert errors == [] and "Traceback" not in stderr, stderr
        else:
            assert len(errors) == 1 and "Traceback" not in stderr, (name, stderr)
            assert all(n in errors[0] for n in needles[name]), (name, errors[0])
        assert not (tmp_path / name).exists(), name


def test_a_batch_script_or_a_one_rank_launch_is_not_refused():
    """SLURM_NTASKS without an srun step (the batch script itself, salloc) and a launcher that
    promised one rank leave a one-rank run alone."""
    code = "from scalesgd.comm.mpi import start; print('size', start.init().size)"
    for env in (dict(SLURM_NTASKS="4", SLURM_PROCID="0", SLURM_JOB_ID="7"), dict(PMI_SIZE="1", PMI_RANK="0")):
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env=clean_env(PYTHONPATH=str(ROOT / "src"), **env))
        assert p.returncode == 0 and "size 1" in p.stdout, (env, p.stderr)


@pytest.mark.parametrize("env,library,needles", [
    # srun --mpi=pmi2 with Open MPI: PMI_SIZE and the step's task count both promise 4
    (dict(PMI_SIZE="4", PMI_RANK="0", SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="4"), OPENMPI,
     ["PMI_SIZE=4: srun promised 4", "Open MPI v5.0.11", "--mpi=pmix for Open MPI"]),
    # MPICH's mpiexec starting a venv whose mpi4py loads Open MPI
    (dict(PMI_SIZE="2", PMI_RANK="0"), OPENMPI, ["MPICH's mpiexec promised 2", "MPI4PY_MPIABI=mpich"]),
    (dict(PMIX_SIZE="8", PMIX_RANK="0"), OPENMPI, ["PMIX_SIZE=8", "has 1"]),
    (dict(OMPI_COMM_WORLD_SIZE="3", OMPI_COMM_WORLD_RANK="0"), MPICH, ["Open MPI's mpiexec promised 3",
                                                                     "MPI4PY_MPIABI=openmpi"]),
])
def test_message_names_variable_sizes_and_fix(env, library, needles):
    with pytest.raises(TopologyError) as exc:
        check_world(1, library, env)
    assert all(n in str(exc.value) for n in needles), str(exc.value)


def test_only_the_launchers_rank_0_reports_and_a_kept_promise_passes():
    with pytest.raises(SystemExit) as exc:
        check_world(1, MPICH, dict(PMI_SIZE="4", PMI_RANK="2"))
    assert exc.value.code == 1
    check_world(4, MPICH, dict(PMI_SIZE="4", PMI_RANK="2", SLURM_STEP_NUM_TASKS="1", SLURM_STEP_ID="0"))
    check_world(8, MPICH, dict(SLURM_STEP_NUM_TASKS="2", SLURM_STEP_ID="0"))   # hydra's proxies, one per node
    with pytest.raises(TopologyError, match="MPI4PY_MPIABI=openmpi"):
        check_library(MPICH, dict(OMPI_COMM_WORLD_SIZE="1", OMPI_COMM_WORLD_RANK="0"))
    check_library(OPENMPI, dict(OMPI_COMM_WORLD_SIZE="4"))
    check_library(MPICH, dict(PMI_SIZE="4"))
    # Open MPI 5 speaks only PMIx: under a PMI launcher it is refused before MPI_Init (no help text)
    with pytest.raises(TopologyError, match="PMI_SIZE=2: MPICH's mpiexec promised 2.*MPI4PY_MPIABI=mpich"):
        check_library(OPENMPI, dict(PMI_SIZE="2", PMI_RANK="0"))
    with pytest.raises(TopologyError, match="--mpi=pmix for Open MPI"):
        check_library(OPENMPI, dict(PMI_SIZE="4", PMI_RANK="0", SLURM_STEP_ID="3", SLURM_STEP_NUM_TASKS="4"))
    check_library(OPENMPI.replace("v5.0.11", "v4.1.6"), dict(PMI_SIZE="4"))   # 4.x may have PMI2 support
    check_library(OPENMPI, dict(PMI_SIZE="1"))
