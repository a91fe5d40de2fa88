#!/usr/bin/env bash
# Creates .venv-migraphx: ortinf's serving part over onnxruntime-migraphx 1.27.1 (AMD GPUs).
# onnxruntime-migraphx replaces the onnxruntime wheel, so it gets an environment of its own. The wheel
# links against the system's ROCm 7 and MIGraphX (libamdhip64.so.7, libmigraphx_c.so.3): install ROCm 7
# with the migraphx package from AMD first. Linux x86_64 (glibc >= 2.34), Python >= 3.10.
# Then: .venv-migraphx/bin/ortinf serve PKG --provider migraphx
# usage: scripts/setup_migraphx_env.sh [--dry-run]
set -euo pipefail
exec bash "$(dirname "$0")/setup_provider_env.sh" migraphx "onnxruntime-migraphx==1.27.1" "$@"
