#!/usr/bin/env bash
# Benchmark-only: oneDNN (the `onednn` and `onednn-devel` wheels: libdnnl 3.13 and its headers, with TBB)
# in .venv-bench-onednn, and benchmarks/peers/onednn_matmul.cc compiled against it, for
# benchmarks/onednn_matmul.py (the kernel issue's "oneDNN route" beside ortinf.QMatMul). ~400 MB.
# The wheel is oneAPI's SYCL build: its CPU engine runs on Intel's OpenCL CPU runtime (pulled in as a
# dependency), which the runner points the OpenCL loader at (OCL_ICD_FILENAMES); without it, "could
# not create an engine". Debian's OpenMP builds do not fit here: trixie's libdnnl 3.7 needs glibc
# 2.38 (this image has bookworm's 2.36), and bookworm's 2.6 predates grouped scales. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
venv=.venv-bench-onednn
[ -x $venv/bin/python ] || "$py" -m venv $venv
$venv/bin/pip install -q --disable-pip-version-check "onednn==2026.1.0" "onednn-devel==2026.1.0" tbb
prefix=$(cd $venv && pwd)
# RPATH (not RUNPATH): libdnnl's own dependencies (TBB, the SYCL runtime) are found in the venv too
${CXX:-g++} -std=c++17 -O2 -I"$prefix/include" benchmarks/peers/onednn_matmul.cc -o $venv/bin/onednn_matmul \
  -L"$prefix/lib" -ldnnl -Wl,--disable-new-dtags,-rpath,"$prefix/lib"
OCL_ICD_FILENAMES="$prefix/lib/libintelocl.so" $venv/bin/onednn_matmul 1 64 64 f32 32 1 1 >/dev/null
echo "oneDNN harness: $venv/bin/onednn_matmul"
