"""--limit-mm-per-prompt's values (vLLM's `image=N` and JSON forms), and the media policy's host check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ortinf.errors import ConfigError
from ortinf.tasks.chat.media import MediaPolicy, parse_limit_mm_per_prompt


def test_limit_mm_per_prompt_forms():
    assert parse_limit_mm_per_prompt("image=3") == 3
    assert parse_limit_mm_per_prompt('{"image": 0}') == 0
    assert parse_limit_mm_per_prompt("") == 8  # nothing said: the default
    for value, fragment in (("image=x", "must be an integer"), ("video=2", "images only, not video"), ('{"image": -1}', "0 or more"),
                            ("nonsense", "write image=N")):
        with pytest.raises(ConfigError, match=fragment):
            parse_limit_mm_per_prompt(value)


def test_a_bad_limit_is_one_line_from_the_cli():
    command = [str(Path(sys.executable).with_name("ortinf")), "serve", "--limit-mm-per-prompt", "video=2", "--port", "8799"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)  # refused before the bundled models load
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --limit-mm-per-prompt: ortinf takes images only, not video: write image=N"]


def test_allowed_hosts_are_matched_whole_and_case_blind():
    policy = MediaPolicy(allowed_domains=("Images.Example.com",))
    assert policy.allows("https://images.example.com/cat.png")
    assert not policy.allows("https://images.example.com.evil.net/cat.png")
    assert not policy.allows("https://evil.net/?images.example.com")
    assert not policy.allows("https://example.com/cat.png")
