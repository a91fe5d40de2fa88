#!/usr/bin/env bash
# Creates .venv-openvino: the serving part of ortinf over onnxruntime-openvino 1.24.1, which replaces the
# onnxruntime wheel and so needs an environment of its own. The OpenVINO tests run the exported
# package in it (tests/providers/test_openvino.py). Intel CPUs, GPUs and NPUs; Python >= 3.10.
# usage: scripts/setup_openvino_env.sh [--dry-run]
set -euo pipefail
exec bash "$(dirname "$0")/setup_provider_env.sh" openvino "onnxruntime-openvino==1.24.1" "$@"
