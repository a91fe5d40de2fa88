#!/usr/bin/env bash
# Benchmark-only peer: OpenVINO GenAI (ContinuousBatchingPipeline), in .venv-bench-ovgenai, with
# optimum-intel to convert the Hugging Face model to OpenVINO IR. optimum-intel pulls a torchvision
# built against CUDA torch, which breaks `import transformers` beside the CPU torch pinned here, so
# it is removed (nothing in a causal-LM export needs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python3}
venv=.venv-bench-ovgenai
[ -x $venv/bin/python ] || "$py" -m venv $venv
$venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" "openvino-genai==2026.4.1.0" \
  "openvino==2026.4.1" "openvino-tokenizers==2026.4.1.0" "optimum-intel[openvino]==2.2.0" "numpy>=1.24"
$venv/bin/pip uninstall -q -y torchvision 2>/dev/null || true
$venv/bin/python -c "import openvino_genai, transformers, optimum.intel; print('openvino-genai', openvino_genai.__version__, 'transformers', transformers.__version__)"
