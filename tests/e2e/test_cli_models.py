"""What every command that takes a package accepts: a package folder, a Hugging Face folder, a bundled
model's name, or nothing (the bundled demo llama), with one cache entry per model whichever way it
is named (issue 20)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortinf.bundled import DEMO_LLAMA, DEMO_NAME

ORTINF = str(Path(sys.executable).with_name("ortinf"))
pytestmark = pytest.mark.skipif(not (DEMO_LLAMA / "config.json").is_file(), reason="no committed demo checkpoint")


def run(args: list[str], cache: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORTINF_CACHE": str(cache)}
    return subprocess.run([ORTINF, *args], capture_output=True, text=True, timeout=600, env=env, input=stdin)


def test_the_demo_by_name_folder_or_default_is_one_cache_entry(demo_cache, tmp_path):
    """The three ways of naming the demo find the one entry its first use wrote (the run's demo cache, copied; the
    first use itself: test_demo_server.py): none of them exports again under another key."""
    cache = tmp_path / "cache"
    shutil.copytree(demo_cache, cache)
    greedy = ["--prompt", "def add(a, b):", "-n", "8", "-t", "0"]
    outputs = []
    for ref in ([], [DEMO_NAME], [str(DEMO_LLAMA)]):
        done = run(["generate", *ref, *greedy], cache)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].strip()
    manifests = sorted(cache.rglob("ortinf.json"))
    assert len(manifests) == 1 and manifests[0].parent.name == DEMO_NAME  # exported once, under its served name
    chat = run(["chat", "-n", "4", "-t", "0"], cache, stdin="hello\n/exit\n")
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    inspect = run(["inspect", DEMO_NAME], cache)
    assert inspect.returncode == 0 and "LlamaForCausalLM" in inspect.stdout
    assert sorted(cache.rglob("ortinf.json")) == manifests


def test_a_hugging_face_folder_works_in_generate(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    hf = package.parent / "hf"
    done = run(["generate", str(hf), "--prompt-ids", "5,6,7", "-n", "4"], tmp_path / "cache")
    assert done.returncode == 0, done.stderr
    direct = run(["generate", str(package), "--prompt-ids", "5,6,7", "-n", "4"], tmp_path / "cache")
    assert done.stdout == direct.stdout
    assert [p.parent.name for p in (tmp_path / "cache").rglob("ortinf.json")] == ["hf"]


def test_an_unknown_model_is_one_line(tmp_path):
    for command in (["generate", "no-such-model", "--prompt", "x"], ["chat", "no-such-model"], ["inspect", "no-such-model"]):
        done = run(command, tmp_path / "cache")
        assert done.returncode == 2, done
        assert done.stderr.strip().splitlines() == [
            "error: no-such-model is neither a folder nor a bundled model (bundled: ortinf-demo-llama, all-MiniLM-L6-v2): "
            "pass a package folder made by `ortinf export`, or a Hugging Face model folder"]
