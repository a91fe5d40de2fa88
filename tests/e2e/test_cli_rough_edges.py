"""The rough edges a new user hits first (issue 20, item 7): a busy port, first-use export logging,
progress bars in logs, the package cache's file modes, and sizes in the Python API. Commands that end in a user
error or are checked for what they print run in this process (support/cli_helpers.py); real processes where the
process is the point (a busy port, imports, a server refusing to start, Ctrl-C)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli_helpers import ortinf_in_process

import ortinf
from ortinf.errors import ConfigError

ORTINF = str(Path(sys.executable).with_name("ortinf"))


def test_a_busy_port_is_refused_before_loading_anything(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        done = subprocess.run([ORTINF, "serve", "--port", str(port)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ORTINF_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (Address already in use): pass another --port, or stop what listens there"]
    assert not (tmp_path / "cache").exists() and time.monotonic() - start < 30  # nothing was exported or loaded


def test_export_logs_are_clean_and_the_package_is_readable(decoder_package, tmp_path):
    """Exported with stderr not a terminal: no nested-bar cursor escapes, and the package has the
    modes the umask gives (not the staging folder's 700 / temporary files' 600)."""
    _, package = decoder_package("llama")
    hf = package.parent / "hf"
    done = ortinf_in_process("export", hf, "-o", tmp_path / "pkg")  # stderr is not a terminal here either
    assert done.returncode == 0, done.stderr
    assert "\x1b[A" not in done.stderr  # the nested bar (cursor up) is for terminals only
    mask = os.umask(0)
    os.umask(mask)
    root = tmp_path / "pkg"
    assert stat.S_IMODE(root.stat().st_mode) == 0o777 & ~mask
    for path in root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o777 if path.is_dir() else 0o666) & ~mask, path


def test_first_use_export_is_not_a_warning(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    done = ortinf_in_process("generate", package.parent / "hf", "--prompt-ids", "5,6", "-n", "2", env={"ORTINF_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr


def test_kv_cache_memory_takes_sizes_in_python_too(decoder_package):
    _, package = decoder_package("llama")
    llm = ortinf.LLM(package, kv_cache_memory="2MiB")
    assert llm.engine.config.kv_cache_memory == 2 * 2**20
    with pytest.raises(ConfigError, match="cannot read the size 'lots'"):
        ortinf.LLM(package, kv_cache_memory="lots")
    with pytest.raises(ConfigError, match="kv_cache_memory must be a positive number of bytes or a size such as 256MiB"):
        ortinf.LLM(package, kv_cache_memory=0)


def test_every_engine_setting_is_a_generated_option_of_every_engine_command():
    """issue 30: one engine-args definition (EngineConfig) from which serve, generate, chat and transcribe
    get their options, generated (help text, section and environment variable from the field), with no
    hand-written copy; a command leaves out only what it cannot use, by a named rule."""
    import dataclasses

    from ortinf.cli.chat import chat
    from ortinf.cli.generate import generate
    from ortinf.cli.serve import serve
    from ortinf.cli.serve_options import SINGLE_STREAM_EXCLUDED, SPEECH_EXCLUDED
    from ortinf.cli.transcribe import transcribe
    from ortinf.config import EngineConfig

    for command, excluded in ((serve, frozenset()), (generate, SINGLE_STREAM_EXCLUDED), (chat, SINGLE_STREAM_EXCLUDED),
                              (transcribe, SPEECH_EXCLUDED)):
        params = {p.name: p for p in command.params}
        for spec in dataclasses.fields(EngineConfig):
            if spec.name == "package_dir" or spec.name in excluded:
                continue
            option = params.get(spec.name)
            assert option is not None, f"EngineConfig.{spec.name} is not an option of `ortinf {command.name}`"
            assert spec.metadata["cli"] in option.help and f"[{spec.metadata['section']}]" in option.help
            assert option.envvar == "ORTINF_" + spec.name.upper()
    assert SINGLE_STREAM_EXCLUDED < {f.name for f in dataclasses.fields(EngineConfig)} > SPEECH_EXCLUDED


def test_every_server_setting_is_a_generated_option_of_serve():
    """issue 44: the server's options are declared once, as ServerConfig's fields (ortinf/serve/config.py), and
    `ortinf serve`'s options are generated from them (help, environment variable, parsing), as the engine's are;
    only Ray's, the log level and --config are written by hand."""
    import dataclasses

    from ortinf.cli.serve import serve
    from ortinf.cli.serve_options import server_values
    from ortinf.serve.config import ServerConfig

    params = {p.name: p for p in serve.params}
    fields = [f for f in dataclasses.fields(ServerConfig) if "cli" in f.metadata]
    for spec in fields:
        option = params.get(spec.name)
        assert option is not None and spec.metadata["cli"] in option.help, spec.name
        assert option.envvar == "ORTINF_" + spec.name.upper()
    engine = {f.name for f in dataclasses.fields(ortinf.config.EngineConfig)}
    by_hand = set(params) - {f.name for f in fields} - engine - {"packages"}
    assert by_hand == {"use_ray", "num_replicas", "min_replicas", "max_replicas", "target_ongoing_requests", "cpus_per_replica",
                       "gpus_per_replica", "prefix_routing", "log_level", "config"}
    values = server_values({"max_body_size": "1MiB", "limit_mm_per_prompt": "image=3", "allowed_media_domains": ("a.com, b.org", "c.net"),
                            "reasoning_parser": "auto", "port": 9000})
    config = ServerConfig(packages=(), **values)
    assert (config.max_body_size, config.limit_mm_per_prompt, config.allowed_media_domains, config.reasoning_parser, config.port) == (
        2**20, 3, ("a.com", "b.org", "c.net"), "auto", 9000)


def test_an_engine_option_no_served_package_can_use_is_refused(minilm_package):
    """An embedding model alone with --block-size (a KV-cache option): one line naming the flag, exit 2, before anything
    listens (encoder packages dropped engine options silently); its own step budget (--max-num-seqs) is accepted."""
    package = minilm_package
    done = subprocess.run([ORTINF, "serve", str(package), "--port", "8796", "--block-size", "32"], capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("INFO")]
    assert done.returncode == 2 and len(lines) == 1 and "--block-size: no served model can use it" in lines[0], done.stderr
    from ortinf.tasks.package import check_server_options

    check_server_options([ortinf.manifest.Manifest.load(package)], {"max_num_seqs": 8, "block_size": 16})  # 16: the default


def test_a_bad_config_file_is_one_line(tmp_path):
    """A --config file that is not YAML: one line with where and what (it was 7, with the parser's excerpt and carets)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1,\n  bad")
    done = subprocess.run([ORTINF, "serve", "--config", str(bad)], capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "is not valid YAML at line" in lines[0], done.stderr


def test_engine_options_reach_the_engine(decoder_package, tmp_path):
    from support.server_helpers import running_server

    _, package = decoder_package("llama")
    with running_server([str(package), "--max-model-len", "100", "--block-size", "32", "--seed", "0",
                         "--no-enable-prefix-caching", "--num-blocks", "40"], tmp_path) as server:
        import httpx

        card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
        assert card["max_model_len"] == 100
        too_long = httpx.post(f"{server.url}/v1/completions", json={"prompt": list(range(3, 99)), "max_tokens": 10})
        assert too_long.status_code == 400 and "100" in too_long.json()["error"]["message"]
        same = [httpx.post(f"{server.url}/v1/completions", json={"prompt": list(range(3, 40)), "max_tokens": 2}).json()
                for _ in range(2)]
        assert same[1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}  # no prefix caching (on: 32 of 37 cached)


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--port", "99999"], "Invalid value for '--port': 99999 is not in the range 1<=x<=65535."),
    (["serve", "--max-num-seqs", "0"], "Invalid value for '--max-num-seqs': 0 is not in the range x>=1."),
    (["serve", "--max-queued-requests", "-1"], "Invalid value for '--max-queued-requests': -1 is not in the range x>=0."),
    (["export", "x", "-o", "y", "--tolerance", "-1"], "Invalid value for '--tolerance': -1.0 is not in the range x>0.0."),
    (["generate", "--max-tokens", "0"], "Invalid value for '-n' / '--max-tokens': 0 is not in the range x>=1."),
    (["chat", "--top-p", "0"], "Invalid value for '--top-p': 0.0 is not in the range 0.0<x<=1.0."),
])
def test_bad_cli_values_fail_at_once_in_one_line(tmp_path, args, message):
    """issue 31, item 8: every value is checked before anything starts (exit 2, click's one line)."""
    start = time.monotonic()
    done = ortinf_in_process(*args, env={"ORTINF_CACHE": str(tmp_path / "cache")})
    command = "ortinf " + args[0]
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: {message} (`{command} --help` lists the options)"], done.stderr
    assert not (tmp_path / "cache").exists() and time.monotonic() - start < 30


def test_a_missing_folder_and_a_gguf_file_say_so(tmp_path):
    gguf = tmp_path / "model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    for command in (["chat", str(tmp_path / "nowhere")], ["serve", str(tmp_path / "nowhere")]):
        done = ortinf_in_process(*command)
        assert done.returncode != 0 and done.stderr.strip() == f"error: no such folder: {tmp_path / 'nowhere'}: pass the folder written by " \
                                                               "`ortinf export`", done.stderr
    for command in (["chat", str(gguf)], ["serve", str(gguf)], ["export", str(gguf), "-o", str(tmp_path / "pkg")]):
        done = ortinf_in_process(*command, env={"ORTINF_CACHE": str(tmp_path / "cache")})
        lines = [line for line in done.stderr.strip().splitlines() if not line.startswith(("INFO", "exporting"))]
        assert done.returncode == 2 and len(lines) == 1 and f"cannot read the GGUF file {gguf}" in lines[0], done.stderr  # a broken one


def test_export_checks_its_arguments_before_importing_torch(tmp_path):
    """A missing model folder, or an output folder that exists without --overwrite: one line, exit 2, and torch never
    imported (`export /nope` took 11.7 s to say so, the error glued to a progress bar)."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    for args, message in (([str(tmp_path / "nope"), "-o", str(tmp_path / "out")], f"no such folder: {tmp_path / 'nope'}"),
                          ([str(model), "-o", str(taken)], f"{taken} already exists: pass --overwrite")):
        done = subprocess.run([sys.executable, "-X", "importtime", ORTINF, "export", *args], capture_output=True, text=True, timeout=120)
        imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
        errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
        assert done.returncode == 2 and len(errors) == 1 and message in errors[0], done.stderr[-2000:]
        assert "torch" not in imported and "onnx" not in imported


def test_a_context_or_kv_budget_a_package_cannot_run_is_refused_before_the_server_starts(chat_package):
    """--max-model-len past the package's context was cut to it silently; --kv-cache-memory 1KiB announced the URL,
    then exited 1. Both: one line, exit 2, before anything listens."""
    context = ortinf.manifest.Manifest.load(chat_package).decoder.max_model_len
    for args, message in ((["--max-model-len", "999999"], f"--max-model-len 999999 is longer than this package's context ({context} tokens"),
                          (["--kv-cache-memory", "1KiB"], "the KV cache holds 0 blocks")):
        done = subprocess.run([ORTINF, "serve", str(chat_package), "--port", "8797", *args], capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("INFO")]
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
        assert "Uvicorn running" not in done.stderr
    with pytest.raises(ConfigError, match="longer than this package's context"):
        ortinf.LLM(chat_package, max_model_len=context + 1)


def test_a_whisper_export_without_a_tokenizer_warns_and_ctrl_c_after_an_export_is_not_a_failure(tmp_path):
    """Exporting a Whisper folder without tokenizer.json says what the package cannot do (it was accepted silently);
    a Ctrl-C the moment the export has said it is done exits 0 (it exited 130 while Python tore the exporter down)."""
    import signal

    from support.tiny_models import build_whisper

    build_whisper(tmp_path / "hf")
    process = subprocess.Popen([ORTINF, "export", str(tmp_path / "hf"), "-o", str(tmp_path / "pkg"), "--quiet"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()  # "exported ..." once the package is complete
    assert line.startswith("exported"), line + process.stderr.read()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "no tokenizer.json" in err and "Transcriber.transcribe_ids" in err
