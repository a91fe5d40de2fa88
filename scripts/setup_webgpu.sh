#!/usr/bin/env bash
# Makes the WebGPU execution provider usable here: the onnxruntime-ep-webgpu plugin (it runs on the
# stock onnxruntime wheel, so it goes into .venv) and, on a machine without a GPU, Mesa's software
# Vulkan driver (lavapipe). Debian 12's own Mesa (22.3) is too old for Dawn; bookworm-backports
# carries 25.x, which works. Safe to run again: it only installs what is missing.
#
# Environment the WebGPU provider then needs on a machine with no GPU (tests set it themselves):
#   ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1   (otherwise the plugin lists no device on lavapipe)
set -euo pipefail
cd "$(dirname "$0")/.."

.venv/bin/pip install -q --disable-pip-version-check "onnxruntime-ep-webgpu==0.4.0"

if ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | grep -q '~bpo12'; then
  exit 0  # the backports lavapipe is already installed
fi
if ! grep -qs '^ID=debian' /etc/os-release || ! grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
  echo "setup_webgpu.sh: not Debian 12; install Mesa >= 24 with its Vulkan drivers (lavapipe) yourself" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
list=/etc/apt/sources.list.d/ortinf-bookworm-backports.list
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee "$list" >/dev/null
fi
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -t bookworm-backports \
       mesa-vulkan-drivers libvulkan1 >/dev/null; }; then
  echo "setup_webgpu.sh: could not install mesa-vulkan-drivers from bookworm-backports; WebGPU will find no software device" >&2
fi
