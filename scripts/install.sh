#!/usr/bin/env bash
# Installs ortinf for development in .venv (export + test extras, pinned by constraints.txt), the
# WebGPU provider (scripts/setup_webgpu.sh: its plugin wheel, and Mesa's software Vulkan driver where
# there is no GPU) and the serving-only OpenVINO environment in .venv-openvino (onnxruntime-openvino
# replaces the onnxruntime wheel, so it cannot share .venv). Safe to run again: it only installs what
# is missing. It also builds ortinf's CPU kernel library into ortinf/kernels/lib/, and installs Debian's chromium for the
# chat page's browser test (scripts/setup_browser.sh) and, where node is present, Claude Code and Codex from npm for the
# agent CLI tests (scripts/setup_agent_clis.sh). ORTINF_SKIP_WEBGPU=1 / ORTINF_SKIP_OPENVINO=1 / ORTINF_SKIP_BROWSER=1 /
# ORTINF_SKIP_AGENT_CLIS=1 leave those out.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=(.venv/bin/pip install --disable-pip-version-check --progress-bar on)
# torch: the CPU build of the pinned version (PyPI's Linux torch is the CUDA build, gigabytes of nvidia-*
# wheels). scripts/torch_cpu.py says where it comes from: PyTorch's CPU index when it answers, else this
# machine's pip configuration if that resolves to a CPU build; otherwise it stops with what to do.
torch_pin=$(grep -E '^torch==' constraints.txt)
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '${torch_pin#torch==}')" 2>/dev/null; then
  echo "== installing ${torch_pin} (CPU build)"
  torch_args=$(.venv/bin/python scripts/torch_cpu.py)
  # shellcheck disable=SC2086  # torch_args is pip arguments, split on purpose
  "${pip[@]}" -c constraints.txt $torch_args "$torch_pin"
fi
echo "== installing ortinf and its export, demo, audio and test extras (pinned by constraints.txt)"
"${pip[@]}" -c constraints.txt -e ".[export,demo,audio,vision,test]"
echo "== building ortinf's CPU kernel library"
# ortinf's CPU kernel library (ortinf/kernels/build.py: ONNX Runtime's C API headers from ORTINF_ORT_INCLUDE
# or Debian trixie's libonnxruntime-dev, fetched into build/). Without it: one warning, and CPU
# packages run the portable kernel.
.venv/bin/python ortinf/kernels/build.py
if [ "${ORTINF_SKIP_WEBGPU:-0}" != 1 ]; then
  echo "== the WebGPU provider (scripts/setup_webgpu.sh)"
  bash scripts/setup_webgpu.sh
fi
if [ "${ORTINF_SKIP_BROWSER:-0}" != 1 ]; then
  echo "== a headless browser for the chat page's test (scripts/setup_browser.sh)"
  bash scripts/setup_browser.sh
fi
if [ "${ORTINF_SKIP_AGENT_CLIS:-0}" != 1 ]; then
  echo "== Claude Code and Codex from npm for the agent CLI tests (scripts/setup_agent_clis.sh)"
  # not fatal: without them (npm unreachable) the agent CLI tests skip and say why
  bash scripts/setup_agent_clis.sh || echo "warning: Claude Code and Codex were not installed: tests/e2e/test_agent_clis.py will skip"
fi
if [ "${ORTINF_SKIP_OPENVINO:-0}" != 1 ]; then
  echo "== the OpenVINO environment (scripts/setup_openvino_env.sh)"
  bash scripts/setup_openvino_env.sh
fi
