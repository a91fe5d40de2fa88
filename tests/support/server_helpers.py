"""Starting and stopping real `ortinf serve` processes on 127.0.0.1 for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from support.run_report import REPORT

ORTINF = str(Path(sys.executable).with_name("ortinf"))
FAULT_INJECTION = Path(__file__).resolve().parent / "fault_injection.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def running_server(args: list[str], log_dir: Path, env: dict[str, str] | None = None, wait_healthy: bool = True,
                   timeout: float = 120.0, faults: dict[str, int] | None = None) -> Iterator[Server]:
    """Runs `ortinf serve ARGS --port P`, waits for /health, and stops it (SIGTERM, then kill).
    `faults` (e.g. {"after_steps": 3} or {"token_id": 7}) starts it through tests/support/fault_injection.py."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [ORTINF]
    if faults:
        command = [sys.executable, str(FAULT_INJECTION)]
        env = {**(env or {}), **{f"ORTINF_TEST_FAIL_{key.upper()}": str(value) for key, value in faults.items()}}
    with log_path.open("w") as log:
        process = subprocess.Popen([*command, "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(process, port, log_path)
    try:
        started = time.monotonic()
        deadline = started + timeout
        while True:
            assert process.poll() is None, f"server exited early:\n{server.log()}"
            try:
                status = httpx.get(f"{server.url}/health", timeout=2).status_code
                if status == 200 or (not wait_healthy and status in (200, 503)):
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not healthy in {timeout}s:\n{server.log()}"
            time.sleep(0.1)
        REPORT.record("server", time.monotonic() - started)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (all label sets)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} not in /metrics"
    return total
