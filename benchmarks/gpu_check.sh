#!/usr/bin/env bash
# Runs benchmarks/gpu_check.py on a lent GPU machine (whose python3 has CuPy, PyTorch, mpi4py).
# nvidia-cudnn-frontend is NOT in that image: carry its wheel in .whl/ (docs/gpu.md says how);
# without it the cuDNN column is skipped and only the im2col and torch columns run.
# Usage: bash benchmarks/gpu_check.sh [gpu_check.py args]   (results under $OUT, else ./gpu_check_out)
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-gpu_check_out}"
timeout 470 python3 benchmarks/gpu_check.py "$@" 2>&1 | tee "$OUT.log"
rc=${PIPESTATUS[0]}
mkdir -p "$OUT" && mv -f "$OUT.log" "$OUT/gpu_check.log" 2>/dev/null
exit "$rc"
