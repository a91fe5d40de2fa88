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


def test_ipv6_entries_may_name_a_port():
    policy = MediaPolicy(allowed_domains=("[::1]:8080", "::2", "[::3]"))
    assert policy.allows("http://[::1]:8080/a.png") and not policy.allows("http://[::1]/a.png")
    assert policy.allows("http://[::2]/a.png") and policy.allows("https://[::2]/a.png") and not policy.allows("http://[::2]:81/a.png")
    assert policy.allows("http://[::3]/a.png") and not policy.allows("http://[::3]:8080/a.png")


def test_a_fetch_connects_to_the_resolved_address_and_a_hung_lookup_meets_the_deadline(monkeypatch):
    """A real fetch from a local server goes through the resolver pool; a lookup that hangs (the system resolver has
    no limit of its own: simulated here, there is no hanging DNS server to ask) ends at --media-fetch-timeout."""
    import http.server
    import socket
    import threading
    import time

    from ortinf.errors import RequestError
    from ortinf.tasks.chat import media

    class Image(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"\x89PNG")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Image)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        policy = MediaPolicy(allowed_domains=(f"localhost:{port}",), fetch_timeout=5.0)
        assert media.fetch(f"http://localhost:{port}/cat.png", policy) == b"\x89PNG"
        real = socket.getaddrinfo
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(3) or real(*a, **k))
        start = time.monotonic()
        with pytest.raises(RequestError, match="within 0.5 s"):
            media.fetch(f"http://localhost:{port}/cat.png", MediaPolicy(allowed_domains=(f"localhost:{port}",), fetch_timeout=0.5))
        assert time.monotonic() - start < 1.5
    finally:
        server.shutdown()
