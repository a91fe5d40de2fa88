"""The `ortinf` command line: exports, inspect, and every user error. Real subprocesses where the process itself is
under test (an export and inspect end to end, the current folder, a file-size limit); --help and user errors that
end before a model is written run in this process (support/cli_helpers.py), with the same exit code and stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_helpers import ortinf_in_process
from support.tiny_models import build_decoder

ORTINF = [str(Path(sys.executable).with_name("ortinf"))]


def ortinf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A real `ortinf ARGS` process."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([*ORTINF, *map(str, args)], capture_output=True, text=True, env=full_env, timeout=300)


def here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ortinf ARGS` in this process."""
    return ortinf_in_process(*args, env={"HF_HUB_OFFLINE": "1", **(env or {})})


def assert_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit code 2, one line on stderr that names the problem, and no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli") / "tiny-llama"
    build_decoder("llama", folder)
    return folder


def test_version_and_help_everywhere():
    version = ortinf("--version")
    assert version.returncode == 0 and "ortinf" in version.stdout and "0.1.0" in version.stdout
    for command in ([], ["export"], ["inspect"], ["generate"], ["serve"], ["demo"], ["bench"], ["bench", "serve"]):
        result = here(*command, "--help")
        assert result.returncode == 0 and "Usage:" in result.stdout, command
    real, in_process = ortinf("export", "--help").stdout, here("export", "--help").stdout  # the console script's command
    assert real.splitlines()[0] == in_process.splitlines()[0] == "Usage: ortinf export [OPTIONS] [MODEL]"
    assert "".join(real.split()) == "".join(in_process.split())  # the same text (CliRunner wraps it at its own width)
    export_help = here("export", "--help").stdout
    for option in ("--output", "--task", "--dtype", "--overwrite", "--list-architectures"):
        assert option in export_help


def test_list_architectures():
    result = here("export", "--list-architectures")
    assert result.returncode == 0
    for name in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gpt2", "bert"):
        assert f"  {name}" in result.stdout
    assert "text-generation:" in result.stdout and "feature-extraction:" in result.stdout


def test_export_then_inspect(llama_folder, tmp_path):
    out = tmp_path / "pkg"
    result = ortinf("export", llama_folder, "-o", out)
    assert result.returncode == 0, result.stderr
    assert "max abs diff" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["generation_config.json", "model.cpu.onnx", "model.host-write.onnx", "model.onnx",
                                                           "model.onnx.data", "ortinf.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no staging folder left behind
    table = ortinf("inspect", out)
    assert table.returncode == 0
    assert "LlamaForCausalLM" in table.stdout and "heads / kv heads" in table.stdout and "4 / 2" in table.stdout
    assert "parity vs PyTorch" in table.stdout


def test_existing_output_needs_overwrite_and_overwrite_replaces_only_packages(llama_folder, tmp_path):
    out = tmp_path / "pkg"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert_user_error(here("export", llama_folder, "-o", out, "-q"), "already exists", "--overwrite")
    assert_user_error(here("export", llama_folder, "-o", out, "-q", "--overwrite"), "not an ortinf package", "replaces only packages")
    assert (out / "keep.txt").read_text() == "mine"
    package = tmp_path / "real"
    assert here("export", llama_folder, "-o", package, "-q").returncode == 0
    (package / "stale.txt").write_text("old export")
    result = here("export", llama_folder, "-o", package, "-q", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert not (package / "stale.txt").exists() and (package / "ortinf.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg", "real"]  # no staging or old copies left behind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_overwrite_swaps_the_package_in_one_step(tmp_path):
    """The primitive --overwrite lands with: two folders exchanged atomically, so that the package
    path never stops existing (a server starting meanwhile finds the old package or the new one)."""
    from ortinf.exporter.package import exchange

    old, new = tmp_path / "pkg", tmp_path / ".pkg.partial"
    old.mkdir()
    new.mkdir()
    (old / "which").write_text("old")
    (new / "which").write_text("new")
    assert exchange(new, old)
    assert (old / "which").read_text() == "new" and (new / "which").read_text() == "old"


def test_output_into_the_current_folder_is_refused(llama_folder, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for target in (".", "..", str(work)):
        result = subprocess.run([*ORTINF, "export", str(llama_folder), "-o", target, "-q", "--overwrite"], capture_output=True,
                                text=True, cwd=work, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
        assert_user_error(result, "current folder", "-o pkg")
    assert work.is_dir() and list(work.iterdir()) == []


def test_tokenizer_beyond_the_vocabulary_is_refused(tmp_path):
    """A tokenizer of 218 tokens for a model of 100: export refuses in one line naming both sizes,
    before loading the weights; a package whose manifest vocabulary is below its tokenizer's ids is
    refused at load (`ortinf generate`, `LLM`) instead of failing inside ORT's Gather."""
    from support.tiny_models import add_tokenizer

    from ortinf import LLM
    from ortinf.errors import ConfigError

    folder = tmp_path / "small-vocab"
    model = build_decoder("llama", folder)
    add_tokenizer(folder)  # 218 tokens
    model.config.vocab_size = 100
    model.config.save_pretrained(folder)  # the weights still say 256: export must stop before loading them
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg", "-q"), "218 tokens", "vocabulary has 100")
    assert not (tmp_path / "pkg").exists()
    good = tmp_path / "good"
    build_decoder("llama", good)
    add_tokenizer(good)
    assert here("export", good, "-o", tmp_path / "pkg", "-q").returncode == 0
    manifest = json.loads((tmp_path / "pkg" / "ortinf.json").read_text())
    manifest["decoder"]["vocab_size"] = 200
    (tmp_path / "pkg" / "ortinf.json").write_text(json.dumps(manifest))
    assert_user_error(here("generate", tmp_path / "pkg", "-p", "the lazy dog", "-n", "2"), "218 tokens", "vocabulary has 200")
    assert_user_error(here("serve", tmp_path / "pkg", "--port", "1"), "218 tokens", "vocabulary has 200")
    with pytest.raises(ConfigError, match="vocabulary has 200"):
        LLM(tmp_path / "pkg", provider="cpu", num_blocks=64)


def test_missing_model(tmp_path):
    assert_user_error(here("export", "./no/such/model", "-o", tmp_path / "pkg"), "no such folder")
    result = here("export", "someorg/not-downloaded", "-o", tmp_path / "pkg", env={"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert_user_error(result, "not in the Hugging Face cache", "huggingface-cli download")
    assert not (tmp_path / "pkg").exists()


def test_hub_id_from_local_cache(llama_folder, tmp_path):
    """A hub id already in the HF cache exports with no network."""
    cache = tmp_path / "cache"
    snapshot = cache / "models--someorg--tiny-llama" / "snapshots" / "0123abcd"
    shutil.copytree(llama_folder, snapshot)
    (cache / "models--someorg--tiny-llama" / "refs").mkdir()
    (cache / "models--someorg--tiny-llama" / "refs" / "main").write_text("0123abcd")
    result = ortinf("export", "someorg/tiny-llama", "-o", tmp_path / "pkg", "-q", env={"HF_HUB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "pkg" / "ortinf.json").read_text())["source"] == "someorg/tiny-llama"


def test_unsupported_architecture(tmp_path):
    folder = tmp_path / "xlnet"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "xlnet", "architectures": ["XLNetLMHeadModel"]}))
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg"), "'xlnet' is not supported", "llama", "gpt2")
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg", "--task", "text-generation"), "'xlnet'", "llama")
    t5 = tmp_path / "t5"  # a supported family without its weights: one line, no progress bar before it
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}))
    assert_user_error(here("export", t5, "-o", tmp_path / "pkg"), "cannot load", "t5")


def test_corrupt_config(llama_folder, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(llama_folder, folder)
    (folder / "config.json").write_text('{"model_type": "llama", ')
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg"), "config.json is not valid JSON")
    (folder / "config.json").write_text('{"hidden_size": 4}')
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg"), "has no model_type")
    os.remove(folder / "config.json")
    assert_user_error(here("export", folder, "-o", tmp_path / "pkg"), "has no config.json")
    assert not (tmp_path / "pkg").exists()


def test_corrupt_weights_leave_nothing(llama_folder, tmp_path):
    folder = tmp_path / "bad-weights"
    shutil.copytree(llama_folder, folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    assert_user_error(here("export", folder, "-o", tmp_path / "out" / "pkg", "-q"), "cannot load the weights")
    assert list((tmp_path / "out").iterdir()) == []


def test_failed_verification_reports_figure_and_leaves_nothing(llama_folder, tmp_path):
    result = here("export", llama_folder, "-o", tmp_path / "pkg", "-q", "--tolerance", "1e-12")
    assert_user_error(result, "verification failed: max abs difference", "above the tolerance 1e-12")
    assert list(tmp_path.iterdir()) == []


def test_inspect_errors(tmp_path):
    assert_user_error(here("inspect", tmp_path / "nope"), "no such folder")
    assert_user_error(here("inspect", tmp_path), "has no ortinf.json")
    (tmp_path / "ortinf.json").write_text("{oops")
    assert_user_error(here("inspect", tmp_path), "ortinf.json is unreadable")


def test_a_write_that_fails_for_space_is_one_line_and_leaves_nothing(llama_folder, tmp_path):
    """Issue 30's attack, finding 11: a full disk ended an export in a raw traceback. A file-size limit
    (RLIMIT_FSIZE, the same failed write a full disk gives, without filling one) stands in for it."""
    import resource
    import signal

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    result = subprocess.run([*ORTINF, "export", str(llama_folder), "-o", str(tmp_path / "pkg"), "--quiet"], capture_output=True,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300, preexec_fn=limited)
    assert_user_error(result, "free some space or write somewhere else")
    assert not (tmp_path / "pkg").exists() and not list(tmp_path.glob(".pkg.partial-*"))
