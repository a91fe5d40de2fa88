#!/usr/bin/env bash
# Creates .venv-openvino: the serving part of ortinf over onnxruntime-openvino, which replaces the
# onnxruntime wheel and so needs an environment of its own. The OpenVINO tests run the exported
# package in it (tests/providers/test_openvino.py).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv-openvino/bin/python ] || "$py" -m venv .venv-openvino
.venv-openvino/bin/pip install -q --disable-pip-version-check "onnxruntime-openvino==1.24.1" "numpy>=1.24" click tqdm \
  "tokenizers>=0.19" "fastapi>=0.110" "uvicorn>=0.29" "jinja2>=3.1" "prometheus-client>=0.20" "pyyaml>=6" "llguidance>=1.0"
# ortinf itself without its dependencies: they would pull the plain onnxruntime wheel back in.
.venv-openvino/bin/pip install -q --disable-pip-version-check --no-deps -e .
