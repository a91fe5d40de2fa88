#!/usr/bin/env bash
# The agent CLIs the suite runs against a served model (tests/e2e/test_agent_clis.py): Claude Code and Codex, from
# npm at pinned versions, into .tools/agent-clis/ (nothing global). Needs node and npm; without them it says so and
# the tests skip with that reason. Safe to run again: it installs only what is missing or of another version.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAUDE_CODE=2.1.332
CODEX=0.171.0
prefix=.tools/agent-clis
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "no node/npm on this machine: the agent CLI tests will skip (install nodejs and npm, then run this script)"
  exit 0
fi
installed() {  # name version
  [ -f "$prefix/node_modules/$1/package.json" ] && grep -q "\"version\": \"$2\"" "$prefix/node_modules/$1/package.json"
}
if installed @anthropic-ai/claude-code "$CLAUDE_CODE" && installed @openai/codex "$CODEX"; then
  echo "Claude Code $CLAUDE_CODE and Codex $CODEX are installed in $prefix"
  exit 0
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE" "@openai/codex@$CODEX"
"$prefix/node_modules/.bin/claude" --version
"$prefix/node_modules/.bin/codex" --version
