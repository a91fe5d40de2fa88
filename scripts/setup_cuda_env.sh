#!/usr/bin/env bash
# Creates .venv-cuda: ortinf's serving part over onnxruntime-gpu 1.31.1 (NVIDIA GPUs, CUDA provider).
# onnxruntime-gpu replaces the onnxruntime wheel, so it gets an environment of its own. Its `cuda` and
# `cudnn` extras install the CUDA 13 runtime and cuDNN 9 as nvidia-* wheels (ortinf preloads them), so
# the system needs only an NVIDIA driver that supports CUDA 13 (nvidia-smi shows "CUDA Version: 13.x").
# Linux x86_64/aarch64 and Windows x64; Python >= 3.11. Then: .venv-cuda/bin/ortinf serve PKG --provider cuda
# usage: scripts/setup_cuda_env.sh [--dry-run]
set -euo pipefail
exec bash "$(dirname "$0")/setup_provider_env.sh" cuda "onnxruntime-gpu[cuda,cudnn]==1.31.1" "$@"
