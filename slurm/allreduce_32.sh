#!/bin/bash
# Jin et al.'s ImageNet setup: allreduce on 32 GPU nodes, one rank and one GPU per node.
# Submit from the repository root (after `make install`):  sbatch slurm/allreduce_32.sh
# Every default below can be overridden: sbatch options on the command line (they win over the
# #SBATCH lines, option by option) and environment variables:
#   CONFIG=jobs/x.toml  DATA=/path/to/shards  EXTRA_ARGS="--epochs 1 --lr 0.05"  VENV=/path/to/venv
#   RUNS=runs (parent of the run directory)  RUN_DIR=... (the run directory itself)
#   SCALESGD_LAUNCHER=srun|mpirun  SCALESGD_PMI=pmi2|pmix  (srun's --mpi plugin: pmi2 for the MPICH
#   wheel, pmix for Open MPI; a wrong one silently gives every rank size 1)
# See docs/slurm.md.  GENERATED from slurm/template.sh by slurm/generate.py -- edit those instead.
#SBATCH --job-name=allreduce_32
#SBATCH --nodes=32
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:1
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
set -uo pipefail
cd "${SCALESGD_ROOT:-${SLURM_SUBMIT_DIR:-.}}"

CONFIG=${CONFIG:-jobs/imagenet-allreduce-32.toml}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUN_DIR=${RUN_DIR:-${RUNS:-runs}/${SLURM_JOB_NAME:-allreduce_32}-${SLURM_JOB_ID:-local}}
read -r -a extra <<< "${EXTRA_ARGS:-}"
args=(-m src.main --config "$CONFIG")
[ -n "${DATA:-}" ] && args+=(--data "$DATA")
# Requeued (same job id, same RUN_DIR): continue from the last checkpoint if there is one.
if compgen -G "$RUN_DIR/checkpoints/*.h5" > /dev/null; then
    args+=(--resume "$RUN_DIR")
else
    args+=(--run-dir "$RUN_DIR")
fi
args+=("${extra[@]}")

# CuPy compiles kernels into a cache; keep it on node-local disk, one per job and node.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-${TMPDIR:-/tmp}/cupy-cache-${USER:-u}-${SLURM_JOB_ID:-0}}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
mkdir -p "$(dirname "$RUN_DIR")"

ntasks=${SLURM_NTASKS:-1}
case "${SCALESGD_LAUNCHER:-srun}" in
    srun)   launch=(srun --mpi="${SCALESGD_PMI:-pmi2}" --kill-on-bad-exit=1
                    bash -c 'mkdir -p "$CUPY_CACHE_DIR" && exec "$@"' _ "$PY") ;;
    mpirun) launch=("$VENV/bin/mpiexec" -n "$ntasks" "$PY") ;;
    *)      echo "SCALESGD_LAUNCHER must be srun or mpirun" >&2; exit 2 ;;
esac
echo "$(date -Is) job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}): $ntasks ranks, run dir $RUN_DIR"
echo "+ ${launch[*]} ${args[*]}"

# The launcher runs in the background so that bash can run the trap while waiting (bash runs
# traps only between commands); the trap passes Slurm's warning signal on to every rank, which
# checkpoints at the next safe point and exits.
got_signal=""
forward() { got_signal=$1; echo "$(date -Is) got SIG$1, forwarding to the ranks"; kill -"$1" "$pid" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
"${launch[@]}" "${args[@]}" &
pid=$!
while :; do
    wait "$pid"; rc=$?
    kill -0 "$pid" 2>/dev/null || break
done
echo "$(date -Is) launcher exited with code $rc"

# Preempted or out of time before the end: put the job back in the queue (same job id, same RUN_DIR).
if [ -n "$got_signal" ] && [ ! -f "$RUN_DIR/summary.json" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "$(date -Is) not finished: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
fi
exit "$rc"
