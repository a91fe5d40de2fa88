"""The real agent CLIs against `ortinf serve`: Claude Code (`claude -p`, the Messages API) and Codex (`codex exec`,
the Responses API), installed from npm at pinned versions by scripts/setup_agent_clis.sh (the install runs it where
node is present; these tests skip with that reason elsewhere).

The served model is support/recipes.py's agent_llama: random weights at a tiny shape with a 32k context and the
bundled demo's tokenizer (Claude Code's request is ~2.6k tokens of it, Codex's ~11k), whose head prefers the end of a
reply and of a JSON string. Under --default-tool-choice required every turn is a grammar-forced call with short
arguments (`{"file_path": ")"}`): a tool round trip in seconds that runs nothing harmful. --access-log gives the
status of every request the CLIs sent."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.server_helpers import running_server

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".tools" / "agent-clis" / "node_modules" / ".bin"
CLAUDE, CODEX = BIN / "claude", BIN / "codex"
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


def _installed(tool: Path) -> None:
    if not tool.exists():
        reason = "no node/npm on this machine" if shutil.which("npm") is None else "not installed"
        pytest.skip(f"{tool.name}: {reason} (scripts/setup_agent_clis.sh installs it where node is present)")


@pytest.fixture(scope="module")
def server(package_factory, tmp_path_factory):
    package = package_factory.package("agent_llama", name="agent")
    args = [str(package), "--served-model-name", "agent", "--kv-cache-memory", "256MiB", "--access-log",
            "--default-tool-choice", "required"]
    with running_server(args, tmp_path_factory.mktemp("agent-logs")) as server:
        yield server


def _log(server) -> str:  # the whole log (Server.log() keeps its last 4,000 characters)
    return server.log_path.read_text(errors="replace")


def _statuses(server, path: str, since: int) -> list[int]:
    """The statuses the access log shows for `path` (query strings aside) after the log's first `since` characters."""
    return [int(m["status"]) for m in ACCESS.finditer(_log(server)[since:]) if m["path"].split("?")[0] == path]


def _home(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    return {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex"), "NO_COLOR": "1"}


def test_claude_code_runs_a_tool_round_trip(server, tmp_path):
    """`claude -p` with only the Read tool, two turns: each request is a 200; the first turn's forced call is run by
    Claude Code (Read of a file that does not exist) and its tool_result goes back in the second request."""
    _installed(CLAUDE)
    env = {**_home(tmp_path), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-unused", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}
    since = len(_log(server))
    done = subprocess.run([str(CLAUDE), "-p", "read the notes", "--max-turns", "2", "--tools", "Read", "--model", "agent",
                           "--output-format", "stream-json", "--verbose"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    calls = [block for e in events if e.get("type") == "assistant" for block in e["message"]["content"] if block["type"] == "tool_use"]
    results = [block for e in events if e.get("type") == "user" for block in e["message"]["content"]
               if isinstance(block, dict) and block.get("type") == "tool_result"]
    assert calls and all(call["name"] == "Read" for call in calls), done.stdout[-2000:] + done.stderr[-2000:]
    assert results and results[0]["tool_use_id"] == calls[0]["id"]
    statuses = _statuses(server, "/v1/messages", since)
    assert len(statuses) >= 2 and set(statuses) == {200}, statuses
    usage = next(e for e in events if e.get("type") == "assistant")["message"]["usage"]  # message_start's
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 1000


def test_claude_code_retries_a_max_tokens_beyond_the_context(server, tmp_path):
    """Claude Code asks max_tokens 32000 (beyond the 32k context with its prompt): ortinf's 400 is worded as
    Anthropic's (`input length and max_tokens exceed context limit: A + B > C`), the only wording Claude Code
    recovers from, and its retry with a max_tokens that fits is a 200."""
    _installed(CLAUDE)
    env = {**_home(tmp_path), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-unused"}
    since = len(_log(server))
    done = subprocess.run([str(CLAUDE), "-p", "hi", "--max-turns", "1", "--tools", "Read", "--model", "agent", "--output-format", "json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    statuses = _statuses(server, "/v1/messages", since)
    assert statuses[0] == 400 and statuses[1:] and set(statuses[1:]) == {200}, (statuses, done.stdout[-2000:])
    result = json.loads(done.stdout.splitlines()[-1])  # its one turn ends in a (forced) call: "max turns", not an API error
    assert result["subtype"] == "error_max_turns" and result.get("api_error_status") is None, done.stdout[-2000:]


def _codex(arguments: list[str], env: dict[str, str], cwd: Path, server, since: int) -> list[dict]:
    """The events of `codex exec --json ARGUMENTS`, stopped once it has sent three requests to /v1/responses (each after
    the first carries the outputs of the calls before it: round trips, whatever tools the random model picked, some of
    which Codex answers without an event) or its turn ended."""
    codex = subprocess.Popen([str(CODEX), "exec", "--json", "--skip-git-repo-check", *arguments, "-m", "agent", "say hi"], cwd=cwd, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                             start_new_session=True)  # npm's `codex` is node running the native binary: stop them both
    events: list[dict] = []

    def read() -> None:
        for line in codex.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120  # a bound, in case it hangs
    try:
        while time.monotonic() < deadline and codex.poll() is None:
            ended = any(e.get("type") in ("error", "turn.failed", "turn.completed") for e in events)
            if ended or len(_statuses(server, "/v1/responses", since)) >= 3:
                break
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(codex.pid, signal.SIGKILL)
        codex.wait()
        reader.join(timeout=10)
    time.sleep(0.5)  # the access log line of a request in flight
    return events


def test_codex_runs_tool_round_trips(server, tmp_path):
    """`codex exec` (the stock CLI speaks only the Responses API: namespace tools and the hosted web_search in every
    request): every request is a 200, and its forced calls run and go back as function_call_output (the next request).
    Forced every turn, the turn never ends: the run is stopped after three requests."""
    _installed(CODEX)
    env = {**_home(tmp_path), "OPENAI_API_KEY": "sk-unused"}
    provider = f'model_providers.ortinf={{name="ortinf", base_url="{server.url}/v1", wire_api="responses", env_key="OPENAI_API_KEY"}}'
    since = len(_log(server))
    events = _codex(["-c", "model_provider=ortinf", "-c", provider], env, tmp_path, server, since)
    output = "\n".join(map(json.dumps, events))
    assert not [e for e in events if e.get("type") in ("error", "turn.failed")], output[-3000:]
    statuses = _statuses(server, "/v1/responses", since)
    assert len(statuses) >= 3 and set(statuses) == {200}, (statuses, output[-3000:])
    assert "/v1/responses: ignored request fields" in _log(server)[since:]  # named in the log and X-Ignored-Fields


def test_codex_takes_ortinf_for_ollama(server, tmp_path):
    """`codex --oss --local-provider ollama` checks /api/version (it needs Ollama >= 0.13.4; ortinf said 0.12.0 and
    was refused) and /api/tags, then runs its turns on /v1/responses."""
    _installed(CODEX)
    env = {**_home(tmp_path), "CODEX_OSS_BASE_URL": f"{server.url}/v1"}
    since = len(_log(server))
    events = _codex(["--oss", "--local-provider", "ollama"], env, tmp_path, server, since)
    output = "\n".join(map(json.dumps, events))
    assert not [e for e in events if e.get("type") in ("error", "turn.failed")], output[-3000:]
    assert _statuses(server, "/api/version", since) == [200], _log(server)[since:][-3000:]
    statuses = _statuses(server, "/v1/responses", since)
    assert len(statuses) >= 2 and set(statuses) == {200}, (statuses, output[-3000:])
