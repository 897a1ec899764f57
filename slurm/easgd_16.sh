#!/bin/bash
# Jin et al.'s ImageNet setup: easgd with 16 workers + 1 parameter server (17 ranks) on 16 GPU nodes.
# Submit from the repository root (after `make install`):  sbatch slurm/easgd_16.sh
# Every default below can be overridden: sbatch options on the command line (they win over the
# #SBATCH lines, option by option) and environment variables:
#   CONFIG=jobs/x.toml  DATA=/path/to/shards  EXTRA_ARGS="--epochs 1 --lr 0.05"  VENV=/path/to/venv
#   RUNS=runs (parent of the run directory)  RUN_DIR=... (the run directory itself)
#   SCALESGD_LAUNCHER=srun|mpirun  SCALESGD_PMI=pmi2|pmix  (srun's --mpi plugin: pmi2 for the MPICH
#   wheel, pmix for Open MPI; a wrong one is refused at start)
#   SIGNAL_LEAD=300 (seconds; when you pass sbatch --signal=B:USR1@N, set it to the same N)
# Before launching, the script checks VENV, the time limit and (by a dry run) the config, data and run dir.
# See docs/slurm.md.  GENERATED from slurm/template.sh by slurm/generate.py -- edit those instead.
#SBATCH --job-name=easgd_16
#SBATCH --nodes=16
#SBATCH --ntasks=17
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:1
#SBATCH --time=48:00:00
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
set -uo pipefail
cd "${SCALESGD_ROOT:-${SLURM_SUBMIT_DIR:-.}}"

CONFIG=${CONFIG:-jobs/imagenet-easgd-16.toml}
SCALESGD_DEFAULT_NAME=easgd_16
source slurm/run.sh      # the shared body: run directory, launcher, signal forwarding, requeue
