#!/bin/bash
# The body every slurm/*.sh script shares: sourced by them (after their #SBATCH lines, from the
# repository root), so that the batch shell itself runs the signal trap.  Expects
# CONFIG (the job file) and SCALESGD_DEFAULT_NAME; see slurm/template.sh and docs/slurm.md.
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUN_DIR=${RUN_DIR:-${RUNS:-runs}/${SLURM_JOB_NAME:-$SCALESGD_DEFAULT_NAME}-${SLURM_JOB_ID:-local}}
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
