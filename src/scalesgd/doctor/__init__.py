"""``scalesgd doctor``: what a user runs first on a new machine or cluster, under the same launcher
as a training job (``mpiexec -n N`` / ``srun``), before spending a large allocation.

Every rank takes part; rank 0 prints one table, a row per check with its status (``ok``, ``warn``,
``fail``, ``n/a``) and, unless ok, a one-line fix, and writes the same rows as JSON (``--json``,
default ``RUN_DIR/doctor.json``).  The exit status is 1 when any row failed (or the JSON could not be
written), else 0.  The checks, in order (every rank calls every check, in this order, since some
are collectives):

- the MPI library mpi4py loaded, the launch (``comm/probe.start``: a launch that made every rank a
  singleton is a failed row, not a refusal) and the ranks per node against the launcher's promise;
- all-reduce bus bandwidth within a node and across nodes, next to a memory copy's;
- one-sided progress: Get / Accumulate / Fetch_and_op while the target computes outside MPI;
- CuPy and the CUDA driver, the rank -> GPU mapping, NCCL, CUDA-aware MPI, cuDNN Frontend, the
  fast paths; DALI decode of one JPEG on the CPU and on the GPU;
- the shard directory (``--data``) and free disk in the run directory.

The GPU branches (``gpu_facts``, ``check_nccl``, ``check_cuda_aware_mpi``'s transfer,
``check_cudnn_frontend``, ``kernel_checks``, ``_decode_on_node`` with a device) are plain CuPy /
DALI calls that have NEVER RUN ON A GPU; on a machine without one those rows read
n/a with the reason.  A deadline (``--deadline``) ends the job naming the check that hung.
"""
from .base import FAIL, NA, OK, WARN, Check, Ctx
from .mpi import bus_gbs, progress_fix, rma_targets, slurm_tasks_on_node
from .run import CHECKS, main, make_parser, render

__all__ = ["CHECKS", "FAIL", "NA", "OK", "WARN", "Check", "Ctx", "bus_gbs", "main", "make_parser",
           "progress_fix", "render", "rma_targets", "slurm_tasks_on_node"]
