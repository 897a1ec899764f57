#!/usr/bin/env bash
# The first GPU contact in one call of at most GPU_CHECK_TOTAL_S seconds, 420 (7 minutes) unless told
# (docs/gpu.md, "One attempt on one GPU"):
#  1. installs what this python3 lacks into a prefix ($GPU_CHECK_PREFIX): an MPI (the mpich wheel)
#     when mpi4py finds no MPI library or there is no mpiexec; CuPy for the driver's CUDA (12 or 13)
#     unless one is preinstalled (the machine's own is then used, and sets the CUDA major); the
#     cuDNN frontend and DALI of that CUDA.  From the wheels in .whl/ first (offline), else the
#     package index, which is probed once, when a part first needs it (a lent machine that cannot
#     reach it loses 20 s, not minutes); what cannot be installed is skipped with the reason ($OUT/install.tsv) and the
#     check skips what needs it.  `pip install --target` would drop a wheel's data files (the mpich
#     wheel's lib/libmpi.so.12) and leave its bin/ off PATH: --prefix keeps both, and the children
#     get PYTHONPATH, MPI4PY_LIBMPI, MPIEXEC, PATH (and the cuDNN wheel's lib on LD_LIBRARY_PATH);
#  2. runs benchmarks/gpu_check.py with the time left less TESTS_S for step 3 (--budget-s): its log is
#     $OUT/gpu_check.log as it goes, gpu_check.json and .md are rewritten after every case;
#  3. runs python3 -m pytest tests/gpu with what is left, if at least 45 s ($OUT/gpu_tests.log).
# Usage: bash benchmarks/gpu_check.sh [gpu_check.py args]      (results under $OUT, else gpu_check_out/)
#   --dry-run (a CPU, as CI runs it): no device package is installed and tests/gpu is not run.
# Environment: PYTHON (default python3), GPU_CHECK_PREFIX (default $TMPDIR/scalesgd-gpu-check),
#   GPU_CHECK_WHEELS (default .whl), GPU_CHECK_OFFLINE=1 (never the index), GPU_CHECK_TOTAL_S (default
#   420: the one limit of the whole call), MPIEXEC and MPIEXEC_ARGS (honoured; Open MPI run as root gets
#   --allow-run-as-root).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
PY=${PYTHON:-python3}
export OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
PREFIX=${GPU_CHECK_PREFIX:-${TMPDIR:-/tmp}/scalesgd-gpu-check}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
TOTAL_S=${GPU_CHECK_TOTAL_S:-420}
TESTS_S=60                       # kept for tests/gpu (step 3) out of TOTAL_S
INSTALL_S=$((TOTAL_S / 3))       # installing stops starting parts after this (what is left: skipped)
DRY=0
for a in "$@"; do [ "$a" = --dry-run ] && DRY=1; done
: > "$OUT/install.tsv"
: > "$OUT/install.log"
note() { echo "$*" | tee -a "$OUT/install.log"; }
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT/install.tsv"; note "install $1: $2${3:+ ($3)}"; }

use_prefix() {   # the prefix's packages, MPI library, launcher and cuDNN library, for every child
    local d
    for d in $(find "$PREFIX" -maxdepth 5 -type d \( -name site-packages -o -name dist-packages \) 2>/dev/null); do
        case ":${PYTHONPATH:-}:" in *":$d:"*) ;; *) export PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" ;; esac
    done
    for d in "$PREFIX/lib/libmpi.so.12" "$PREFIX/lib/libmpi.so.40"; do
        if [ -f "$d" ]; then export MPI4PY_LIBMPI="$d"; break; fi
    done
    if [ -x "$PREFIX/bin/mpiexec" ]; then
        export MPIEXEC="$PREFIX/bin/mpiexec" PATH="$PREFIX/bin:$PATH"
    fi
    d=$(find "$PREFIX" -maxdepth 7 -type d -path '*nvidia/cudnn/lib' 2>/dev/null | head -1)
    if [ -n "$d" ]; then export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
    return 0
}

pip_into_prefix() {   # NAME REQUIREMENT...: from .whl/ first (offline), then the index unless offline
    # (recorded as installed, unless PENDING=1: the caller records it once it knows it works)
    local name=$1 from
    shift
    local pip=("$PY" -m pip install -q --disable-pip-version-check --no-cache-dir --prefix "$PREFIX")
    if [ $((SECONDS - T0)) -ge "$INSTALL_S" ]; then
        note "install $name: not started: ${INSTALL_S} s of installing spent (GPU_CHECK_TOTAL_S / 3)"
        return 1
    fi
    if ls "$WHEELS"/*.whl >/dev/null 2>&1 &&
        timeout 120 "${pip[@]}" --no-index --find-links "$WHEELS" "$@" >> "$OUT/install.log" 2>&1; then
        from="from $WHEELS/"
    elif online && timeout 180 "${pip[@]}" --timeout 15 --retries 0 "$@" >> "$OUT/install.log" 2>&1; then
        from="from the package index"
    else
        return 1
    fi
    use_prefix
    INSTALLED="$* $from into $PREFIX"
    [ "${PENDING:-0}" = 1 ] || record "$name" installed "$INSTALLED"
}

NOWHERE="no wheel in $WHEELS/ and the package index unreachable or refused (see install.log)"
ONLINE=""
online() {       # whether the package index answers: probed once, on the first part that needs it
    if [ "${GPU_CHECK_OFFLINE:-0}" = 1 ]; then return 1; fi
    if [ -z "$ONLINE" ]; then
        local url=${PIP_INDEX_URL:-$("$PY" -m pip config get global.index-url 2>/dev/null)}   # pip's own
        url=${url:-https://pypi.org/simple/}
        note "probing the package index $url (once, at most 20 s)"
        if timeout 20 "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)" \
            "$url" >> "$OUT/install.log" 2>&1; then ONLINE=yes; else ONLINE=no; fi
        record index "$([ "$ONLINE" = yes ] && echo reachable || echo unreachable)" "$url"
    fi
    [ "$ONLINE" = yes ]
}
launcher() {     # the mpiexec the check will use: $MPIEXEC, beside this python, on PATH
    local beside
    beside="$(dirname "$("$PY" -c 'import sys; print(sys.executable)' 2>/dev/null)")/mpiexec"
    if [ -n "${MPIEXEC:-}" ]; then echo "$MPIEXEC"; elif [ -x "$beside" ]; then echo "$beside"; else command -v mpiexec; fi
}
mpi_library() {  # the MPI library mpi4py loads (without starting MPI), or nothing
    "$PY" -c "import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" 2>/dev/null
}
has() { "$PY" -c "import $1" >/dev/null 2>&1; }

# ----------------------------------------------------------------------------- 1. install
mkdir -p "$PREFIX"
use_prefix                       # what an earlier call installed there is used as it is
note "gpu_check.sh $(date '+%Y-%m-%d %H:%M'): $("$PY" --version 2>&1), prefix $PREFIX, wheels $WHEELS/"
if [ -n "$(mpi_library)" ] && [ -n "$(launcher)" ]; then
    record mpi preinstalled "$(mpi_library); $(launcher)"
else
    has mpi4py || pip_into_prefix mpi4py "mpi4py>=4.0" || record mpi4py skipped "$NOWHERE"
    pip_into_prefix mpich "mpich>=4.1" || record mpich skipped "$NOWHERE"
    if [ -n "$(mpi_library)" ] && [ -n "$(launcher)" ]; then
        record mpi usable "$(mpi_library); $(launcher)"
    else
        record mpi unusable "mpi4py finds no MPI library or no mpiexec: the allreduce case is skipped"
    fi
fi
# Open MPI 5's launcher says "Open MPI" or "prte" in its version, Open MPI 4's says "OpenRTE".
if [ -z "${MPIEXEC_ARGS:-}" ] && [ "$(id -u)" = 0 ] && "$(launcher)" --version 2>/dev/null | grep -qiE "Open MPI|OpenRTE|prte"; then
    export MPIEXEC_ARGS="--allow-run-as-root --oversubscribe"       # Open MPI refuses root without it
    note "MPIEXEC_ARGS=$MPIEXEC_ARGS (Open MPI, run as root)"
fi
if [ "$DRY" = 1 ]; then
    record device skipped "dry run: CuPy, the cuDNN frontend and the device DALI are not installed"
    MAJOR=none
else
    cupy_major=$("$PY" -c "import cupy; print(cupy.cuda.runtime.runtimeGetVersion() // 1000)" 2>/dev/null)
    driver_major=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -1)
    if [ -n "$cupy_major" ]; then
        MAJOR=$cupy_major
        record cupy preinstalled "$("$PY" -c 'import cupy; print(cupy.__version__)') for CUDA $MAJOR: used as it is"
    else
        MAJOR=$([ "${driver_major:-12}" -ge 13 ] && echo 13 || echo 12)
        pip_into_prefix cupy "cupy-cuda${MAJOR}x>=14" "nvidia-nccl-cu${MAJOR}" "ml_dtypes>=0.5" ||
            record cupy skipped "$NOWHERE: no device case can run"
        # then its [ctk] extra, on its own (the CUDA toolkit's wheels: NVRTC and the headers the fused
        # kernels compile with, which a driver-only image lacks; large: CuPy is not lost if it fails)
        if has cupy && ! "$PY" -c "import cupy; cupy.cuda.nvrtc.getVersion()" >/dev/null 2>&1; then
            pip_into_prefix cupy_ctk "cupy-cuda${MAJOR}x[ctk]>=14" ||
                record cupy_ctk skipped "$NOWHERE: the fused kernels cannot compile without NVRTC"
        fi
    fi
    has ml_dtypes || pip_into_prefix ml_dtypes "ml_dtypes>=0.5" || record ml_dtypes skipped "$NOWHERE: bf16 fails"
    if has cudnn; then
        record cudnn_frontend preinstalled "$("$PY" -c 'import cudnn; print(cudnn.__version__)')"
    else
        # Its recent wheels require the CUTLASS DSL and TVM FFI wheels (its DSL kernels, which this
        # project does not use): without them at hand, the frontend alone (--no-deps), if it imports.
        pip_into_prefix cudnn_frontend "nvidia-cudnn-frontend>=1.8" ||
            { PENDING=1 pip_into_prefix cudnn_frontend --no-deps "nvidia-cudnn-frontend>=1.8" && has cudnn &&
              record cudnn_frontend installed "$INSTALLED (it imports)"; } ||
            record cudnn_frontend skipped "$NOWHERE, or it does not import without its dependencies: the cuDNN path is skipped, im2col runs"
    fi
    if has cudnn && ! "$PY" -c "import cudnn; cudnn.backend_version()" >/dev/null 2>&1; then
        pip_into_prefix cudnn "nvidia-cudnn-cu${MAJOR}>=9" ||
            record cudnn skipped "the frontend loads no libcudnn and $NOWHERE"
    fi
fi
if has nvidia.dali; then
    record dali preinstalled "$("$PY" -c 'import nvidia.dali as d; print(d.__version__)')"
elif [ "$DRY" = 0 ] && pip_into_prefix dali "nvidia-dali-cuda${MAJOR}0"; then
    :
else
    export GPU_CHECK_DALI_SKIPPED="nvidia-dali-cuda${MAJOR}0: $NOWHERE"
    [ "$DRY" = 1 ] && GPU_CHECK_DALI_SKIPPED="a dry run installs no DALI"
    record dali skipped "$GPU_CHECK_DALI_SKIPPED"
fi

# ----------------------------------------------------------------------------- 2. the check
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
budget=$((TOTAL_S - (SECONDS - T0) - TESTS_S - 30))     # (30: the check's own start and end)
if [ "$budget" -lt 30 ]; then        # (the total holds: installing took what the check had)
    note "gpu_check.py: not run: $budget s left of $TOTAL_S after $((SECONDS - T0)) s of installing"
    rc=1
else
    note "gpu_check.py: budget $budget s ($((SECONDS - T0)) s spent installing)"
    timeout -k 10 $((budget + 20)) "$PY" benchmarks/gpu_check.py --budget-s "$budget" "$@" 2>&1 |
        tee "$OUT/gpu_check.log"
    rc=${PIPESTATUS[0]}
fi

# ----------------------------------------------------------------------------- 3. tests/gpu
left=$((TOTAL_S - (SECONDS - T0)))
tests_rc=0
if [ "$DRY" = 1 ]; then
    echo "tests/gpu not run: a dry run (the CPU test suite runs their CPU cases)" | tee "$OUT/gpu_tests.log"
elif [ "$left" -lt 45 ]; then
    echo "tests/gpu not run: $left s left of $TOTAL_S" | tee "$OUT/gpu_tests.log"
elif ! has pytest; then
    echo "tests/gpu not run: pytest is not installed for $PY" | tee "$OUT/gpu_tests.log"
else
    timeout -k 5 $((left - 10)) "$PY" -m pytest tests/gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
    tests_rc=${PIPESTATUS[0]}
fi
[ "$rc" -eq 0 ] && rc=$tests_rc
exit "$rc"
