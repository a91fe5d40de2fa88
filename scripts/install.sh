#!/usr/bin/env bash
# Installs ortinf for development in .venv (export + test extras, pinned by constraints.txt), the
# WebGPU provider (scripts/setup_webgpu.sh: its plugin wheel, and Mesa's software Vulkan driver where
# there is no GPU) and the serving-only OpenVINO environment in .venv-openvino (onnxruntime-openvino
# replaces the onnxruntime wheel, so it cannot share .venv). Safe to run again: it only installs what
# is missing. It also builds ortinf's CPU kernel library into kernels/lib/. ORTINF_SKIP_WEBGPU=1 / ORTINF_SKIP_OPENVINO=1 leave those out.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[export,demo,test]"
# ortinf's CPU kernel library (kernels/build.py: ONNX Runtime's C API headers from ORTINF_ORT_INCLUDE
# or Debian trixie's libonnxruntime-dev, fetched into build/). Without it: one warning, and CPU
# packages run the portable kernel.
.venv/bin/python kernels/build.py
if [ "${ORTINF_SKIP_WEBGPU:-0}" != 1 ]; then
  bash scripts/setup_webgpu.sh
fi
if [ "${ORTINF_SKIP_OPENVINO:-0}" != 1 ]; then
  bash scripts/setup_openvino_env.sh
fi
