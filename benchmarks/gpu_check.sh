#!/usr/bin/env bash
# The first GPU contact in one call (< 10 min on an H200): the parity tests of tests/gpu
# (gpu_tests.log), then benchmarks/gpu_check.py's sections (parity, strict self-check on ResNet-50,
# ResNet-50 vs PyTorch in fp32 and bf16, 2-rank all-reduce per transport, DALI GPU vs CPU decode):
# one JSON and one table.  Needs python3 with CuPy, PyTorch, mpi4py; wheels found in .whl/
# (nvidia-cudnn-frontend, an MPI such as mpich: docs/benchmarks.md#gpu says how) are installed first.
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
