#!/usr/bin/env bash
# Runs benchmarks/gpu_check.py on a lent GPU machine (whose python3 has CuPy, PyTorch, mpi4py).
# nvidia-cudnn-frontend is NOT in that image: carry its wheel in .whl/ (docs/gpu.md says how);
# without it the cuDNN column is skipped and only the im2col and torch columns run.
# Runs the parity tests of tests/gpu first (gpu_tests.log), then the timings.
# Usage: bash benchmarks/gpu_check.sh [gpu_check.py args]   (results under $OUT, else ./gpu_check_out)
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
# first the parity tests of tests/gpu (NumPy and CuPy cases, one call; skipped ones say why)
if python3 -c "import pytest" 2>/dev/null; then
    timeout 100 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
    tests_rc=${PIPESTATUS[0]}
else
    echo "tests/gpu not run: pytest is not installed for python3" | tee "$OUT/gpu_tests.log"
    tests_rc=0
fi
timeout 470 python3 benchmarks/gpu_check.py "$@" 2>&1 | tee "$OUT.log"
rc=${PIPESTATUS[0]}
mv -f "$OUT.log" "$OUT/gpu_check.log" 2>/dev/null
[ "$rc" -eq 0 ] && rc=$tests_rc
exit "$rc"
