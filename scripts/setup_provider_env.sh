#!/usr/bin/env bash
# Creates .venv-NAME: the serving part of ortinf over an ONNX Runtime wheel that replaces the plain
# onnxruntime wheel (onnxruntime-gpu, -migraphx, -directml, -openvino all install the same
# `onnxruntime` module, so none of them can share .venv). ortinf goes in without its dependencies
# (they would pull the plain onnxruntime back in); its serving dependencies come from pyproject.toml.
#
# usage: scripts/setup_provider_env.sh NAME REQUIREMENT [--dry-run]
#   NAME         the environment's suffix (.venv-NAME)
#   REQUIREMENT  the provider wheel, pinned, e.g. "onnxruntime-gpu[cuda,cudnn]==1.31.1"
#   --dry-run    print the steps and let pip resolve them (pip install --dry-run), install nothing
# Environment: PYTHON (default python3); ORTINF_WHEEL_PLATFORM (e.g. win_amd64: the dry run resolves
# for that platform, for wheels this machine cannot install). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/setup_provider_env.sh NAME REQUIREMENT [--dry-run]" >&2
  exit 2
fi
name=$1 requirement=$2 mode=${3:-}
py=${PYTHON:-python3}
venv=.venv-$name
# the serving dependencies of pyproject.toml, without onnxruntime (the provider wheel is that)
mapfile -t deps < <("$py" - <<'PY'
import re
text = open("pyproject.toml", encoding="utf-8").read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for spec in re.findall(r'"([^"]+)"', block):
    if not re.match(r"onnxruntime\b", spec):
        print(spec)
PY
)
if [ "$mode" = --dry-run ]; then
  echo "would create $venv with $py -m venv"
  echo "would install into it: $requirement ${deps[*]}"
  echo "would install ortinf itself with --no-deps (editable)"
  platform=()
  target=()
  if [ -n "${ORTINF_WHEEL_PLATFORM:-}" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    platform=(--platform "$ORTINF_WHEEL_PLATFORM" --only-binary=:all: --python-version 3.11 --implementation cp)
    target=(--target "$tmp")
  fi
  "$py" -m pip install --disable-pip-version-check --dry-run --quiet --no-deps "${platform[@]}" "${target[@]}" "$requirement"
  echo "pip resolves $requirement for ${ORTINF_WHEEL_PLATFORM:-this machine}: ok"
  exit 0
fi
[ -x "$venv/bin/python" ] || [ -x "$venv/Scripts/python.exe" ] || "$py" -m venv "$venv"
bin=$venv/bin
[ -d "$venv/Scripts" ] && bin=$venv/Scripts  # Windows (Git Bash)
"$bin/python" -m pip install --disable-pip-version-check --progress-bar on "$requirement" "${deps[@]}"
"$bin/python" -m pip install --disable-pip-version-check --no-deps -e .
echo "$venv is ready: $bin/ortinf providers"
