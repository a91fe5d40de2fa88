#!/usr/bin/env bash
# Creates .venv-dml: ortinf's serving part over onnxruntime-directml 1.24.4 (any DirectX 12 GPU on
# Windows x64). onnxruntime-directml replaces the onnxruntime wheel, so it gets an environment of its
# own. Run it from Git Bash (or WSL's bash against a Windows Python via PYTHON=py.exe); Python >= 3.11.
# Then: .venv-dml/Scripts/ortinf serve PKG --provider dml
# usage: scripts/setup_directml_env.sh [--dry-run]   (the dry run works anywhere: it resolves the Windows wheel)
set -euo pipefail
if [ "${1:-}" = --dry-run ]; then
  export ORTINF_WHEEL_PLATFORM=${ORTINF_WHEEL_PLATFORM:-win_amd64}
else
  case "$(uname -s)" in
    MINGW*|MSYS*|CYGWIN*) ;;
    *) echo "setup_directml_env.sh: DirectML runs on Windows only; run this from Git Bash on Windows (or pass --dry-run)" >&2; exit 2 ;;
  esac
fi
exec bash "$(dirname "$0")/setup_provider_env.sh" dml "onnxruntime-directml==1.24.4" "$@"
