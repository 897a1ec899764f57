#!/bin/bash
# The built-in demo under Slurm: `sbatch slurm/demo.sh` from the repository root, after `make install`.
# One task for now (the distributed methods and the multi-node scripts come with them).
#SBATCH --job-name=scalesgd-demo
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:15:00
#SBATCH --output=runs/slurm-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
mkdir -p runs
# --mpi=pmi2 matches the MPICH wheel (use --mpi=pmix with Open MPI); scalesgd checks the world size.
srun --mpi=pmi2 .venv/bin/python -m src.main --config jobs/demo.toml --run-dir "runs/slurm-$SLURM_JOB_ID"
