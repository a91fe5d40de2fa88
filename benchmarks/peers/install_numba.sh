#!/usr/bin/env bash
# Benchmark-only: numba in .venv-bench-numba, for benchmarks/attention_kernels.py's in-place paged
# decode attention (a candidate CPU kernel; not used by ortinf itself).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
venv=.venv-bench-numba
[ -x $venv/bin/python ] || "$py" -m venv $venv
$venv/bin/pip install -q --disable-pip-version-check "numba>=0.60" "numpy>=1.24"
$venv/bin/python -c "import numba; print('numba', numba.__version__)"
