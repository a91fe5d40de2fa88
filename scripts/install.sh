#!/usr/bin/env bash
# Installs ortinf for development in .venv (export + test extras, pinned by constraints.txt), the
# WebGPU provider (scripts/setup_webgpu.sh: its plugin wheel, and Mesa's software Vulkan driver where
# there is no GPU) and the serving-only OpenVINO environment in .venv-openvino (onnxruntime-openvino
# replaces the onnxruntime wheel, so it cannot share .venv). Safe to run again: it only installs what
# is missing. ORTINF_SKIP_WEBGPU=1 / ORTINF_SKIP_OPENVINO=1 leave those out.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[export,demo,test]"
if [ "${ORTINF_SKIP_WEBGPU:-0}" != 1 ]; then
  bash scripts/setup_webgpu.sh
fi
if [ "${ORTINF_SKIP_OPENVINO:-0}" != 1 ]; then
  bash scripts/setup_openvino_env.sh
fi
