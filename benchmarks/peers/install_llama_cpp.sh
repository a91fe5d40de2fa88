#!/usr/bin/env bash
# Benchmark-only peer: llama.cpp through llama-cpp-python, in .venv-bench-llamacpp.
# PyPI ships only the source distribution, so this compiles llama.cpp for this CPU (GGML_NATIVE:
# the instruction set of the machine that builds it): ~15-30 minutes on 2 cores. Safe to run again.
# The GGUF files are written by benchmarks/peers/run_llama_cpp.py with the `gguf` package, and
# quantized (Q8_0, Q4_0) with llama.cpp's own llama_model_quantize.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
venv=.venv-bench-llamacpp
[ -x $venv/bin/python ] || "$py" -m venv $venv
if ! $venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $venv/bin/pip install --disable-pip-version-check --no-binary llama-cpp-python "llama-cpp-python==0.3.36"
fi
$venv/bin/pip install -q --disable-pip-version-check "gguf>=0.17" "numpy>=1.24" safetensors
$venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
