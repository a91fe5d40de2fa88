#!/usr/bin/env bash
# Benchmark-only peer: onnxruntime-genai (its Generator, and its model builder, which exports fp32
# and int4 ONNX models), in .venv-bench-genai. The builder of 0.18 needs transformers 5, which the
# main environment cannot have (optimum-onnx needs transformers < 4.58), hence its own venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
venv=.venv-bench-genai
[ -x $venv/bin/python ] || "$py" -m venv $venv
$venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" "onnxruntime-genai==0.18.0" \
  "transformers>=5,<6" "onnx>=1.17" "onnx-ir" "numpy>=1.24" safetensors
$venv/bin/python -c "import onnxruntime_genai as og, transformers; print('onnxruntime-genai', og.__version__, 'transformers', transformers.__version__)"
