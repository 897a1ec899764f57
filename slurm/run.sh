#!/bin/bash
# The body every slurm/*.sh script shares: sourced by them (after their #SBATCH lines, from the
# repository root), so that the batch shell itself runs the signal trap.  Expects
# CONFIG (the job file) and SCALESGD_DEFAULT_NAME; see slurm/template.sh and docs/slurm.md.
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
SIGNAL_LEAD=${SIGNAL_LEAD:-300}   # seconds; must match --signal=B:USR1@N (#SBATCH line or sbatch option)
fail() { echo "scalesgd: error: $*" >&2; exit 1; }
RUN_DIR=${RUN_DIR:-${RUNS:-runs}/${SLURM_JOB_NAME:-$SCALESGD_DEFAULT_NAME}-${SLURM_JOB_ID:-local}}
RUN_DIR=${RUN_DIR%/}                  # (a trailing slash would move the directory into itself below)
JOB_MARK="$RUN_DIR/slurm-job"         # which job started the run in RUN_DIR (its id, or "local")
# Whether RUN_DIR holds a checkpoint: the directory part quoted, so that its name is never a pattern.
has_checkpoint() { local f; for f in "$RUN_DIR"/checkpoints/*.h5; do [ -e "$f" ] && return 0; done; return 1; }
read -r -a extra <<< "${EXTRA_ARGS:-}"
args=(-m src.main --config "$CONFIG")
[ -n "${DATA:-}" ] && args+=(--data "$DATA")
# Requeued (same job id, same RUN_DIR): continue from the last checkpoint if there is one.
if has_checkpoint; then
    args+=(--resume "$RUN_DIR")
else
    args+=(--run-dir "$RUN_DIR")
fi
args+=("${extra[@]}")

# Checks before anything is launched, each failing with one line.
[ -x "$PY" ] || fail "no Python at $PY (VENV=$VENV): run 'make install' in $(pwd), or set VENV=/path/to/venv"

# "[D-][H:]M:S" (squeue %L, the job's time left) -> seconds; nothing for UNLIMITED or unknown.
to_seconds() {
    local t=$1 days=0 s=0 f
    [[ $t =~ ^([0-9]+-)?[0-9]+(:[0-9]+)*$ ]] || return 0
    [[ $t == *-* ]] && { days=${t%%-*}; t=${t#*-}; }
    IFS=: read -r -a f <<< "$t"
    for x in "${f[@]}"; do s=$((s * 60 + 10#$x)); done
    echo $((days * 86400 + s))
}
# Slurm sends the warning (USR1) SIGNAL_LEAD seconds before the limit, up to a minute earlier; a
# limit that leaves almost no time before it makes the job checkpoint and requeue itself endlessly.
left=""
[ -n "${SLURM_JOB_ID:-}" ] && left=$(to_seconds "$(timeout 30 squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null)")
if [ -n "$left" ]; then
    shorter="a longer --time, or a shorter lead: sbatch --signal=B:USR1@60 with SIGNAL_LEAD=60"
    if (( left - SIGNAL_LEAD < 90 )); then
        fail "time limit: ${left} s left, but the warning signal comes ${SIGNAL_LEAD} s before the end" \
             "(--signal=B:USR1@${SIGNAL_LEAD}), leaving no time to train before every requeue: use $shorter"
    elif (( left < 2 * SIGNAL_LEAD )); then
        echo "scalesgd: warning: time limit: ${left} s left and the warning signal comes ${SIGNAL_LEAD} s" \
             "before the end: each attempt trains about $(( (left - SIGNAL_LEAD) / 60 )) min, then" \
             "checkpoints and requeues; for more, use $shorter" >&2
    fi
fi

# Requeued before the first checkpoint (say a node failed soon after the start, and --requeue put the
# job back): RUN_DIR holds the earlier attempt's config and logs but nothing to resume from, and
# --run-dir refuses a directory that holds a run.  Keep that attempt beside, under a new name, and
# start again.  Only on a requeue, and only a run this job started (JOB_MARK): a RUN_DIR that holds
# another job's run (a RUN_DIR set by hand and shared) is still refused, and never moved.
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] 2>/dev/null && [ -e "$RUN_DIR/config.json" ] && ! has_checkpoint \
        && [ ! -e "$RUN_DIR/summary.json" ] && [ "$(cat "$JOB_MARK" 2>/dev/null)" = "${SLURM_JOB_ID:-local}" ]; then
    aside="$RUN_DIR.restart-$SLURM_RESTART_COUNT"
    n=1; while [ -e "$aside" ]; do aside="$RUN_DIR.restart-$SLURM_RESTART_COUNT.$n"; n=$((n + 1)); done
    mv "$RUN_DIR" "$aside" || fail "requeued before the first checkpoint: cannot move $RUN_DIR aside to $aside"
    echo "$(date -Is) requeued before the first checkpoint: the earlier attempt is kept in $aside; starting again"
fi
# The config, the data, the model and the run directory, checked as the ranks will check them (a dry
# run, one process; after the move above, which frees RUN_DIR for a requeued attempt).
err=$("$PY" "${args[@]}" --dry-run 2>&1 >/dev/null); dry=$?
if [ "$dry" -ne 0 ]; then
    line=$(grep '^scalesgd: error: ' <<< "$err" | tail -n 1)
    echo "${line:-scalesgd: error: $(tail -n 1 <<< "$err")} (checked before launching: CONFIG=$CONFIG" \
         "DATA=${DATA:-unset}; see docs/slurm.md)" >&2
    exit "$dry"
fi

# CuPy compiles kernels into a cache; keep it on node-local disk, one per job and node.
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-${TMPDIR:-/tmp}/cupy-cache-${USER:-u}-${SLURM_JOB_ID:-0}}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
mkdir -p "$(dirname "$RUN_DIR")"
if [ ! -e "$RUN_DIR/config.json" ]; then           # a run starts here: mark it as this job's
    mkdir -p "$RUN_DIR" && echo "${SLURM_JOB_ID:-local}" > "$JOB_MARK" || fail "cannot write $JOB_MARK"
fi

ntasks=${SLURM_NTASKS:-1}
case "${SCALESGD_LAUNCHER:-srun}" in
    srun)   launch=(srun --mpi="${SCALESGD_PMI:-pmi2}" --kill-on-bad-exit=1
                    bash -c 'mkdir -p "$CUPY_CACHE_DIR" && exec "$@"' _ "$PY") ;;
    mpirun) read -r -a margs <<< "${MPIEXEC_ARGS:-}"       # e.g. Open MPI: --bind-to none
            launch=("${MPIEXEC:-$VENV/bin/mpiexec}" "${margs[@]}" -n "$ntasks" "$PY") ;;
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

# A step that ended in MPI_Abort or a kill skipped MPI_Finalize, which removes MPI's shared-memory
# segments in /dev/shm: remove this user's segments that no live process uses, on every node.
if [ "$rc" -ne 0 ] && [ "$rc" -ne 75 ]; then
    clean=("$PY" src/scalesgd/comm/shm.py)
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        nodes=${SLURM_JOB_NUM_NODES:-1}
        clean=(srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --mpi=none "${clean[@]}")
    fi
    timeout 60 "${clean[@]}" || echo "$(date -Is) could not clean /dev/shm (see docs/slurm.md)"
fi

# Preempted or out of time before the end: put the job back in the queue (same job id, same RUN_DIR).
if [ -n "$got_signal" ] && [ ! -f "$RUN_DIR/summary.json" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "$(date -Is) not finished: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
fi
exit "$rc"
