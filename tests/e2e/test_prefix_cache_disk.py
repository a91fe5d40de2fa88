"""--prefix-cache-dir through real servers: blocks computed by one server are restored by a server started later with
another KV pool size (its usage counts them as cached prompt tokens, its log and /metrics say what the disk cache holds)
and by a second server running on the same folder; a corrupt block and a FIFO planted in place of a block are misses
with the right reply, not a 500 or a hang; failed writes leave no temporary files; a read-only folder still serves.
The folder's budget across packages is tested on engines (tests/runtime/worker/test_prefix_store.py)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from support.server_helpers import metric, running_server

from ortinf.runtime.worker.prefix_store import chain

BLOCK = 16
FILLER = " the careful assistant answers in one short sentence and nothing more." * 4  # ~290 bytes: ~18 blocks


def text(tag: str) -> str:
    return f"{tag}:{FILLER}"  # a distinct start: no two prompts share a block


def complete(url: str, prompt: str, timeout: float = 120) -> dict:
    response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}, timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def full(reply: dict) -> int:
    """The prompt tokens a complete restore covers: its full blocks, the last token left to compute."""
    return (reply["usage"]["prompt_tokens"] - 1) // BLOCK * BLOCK


def block_files(url: str, folder: Path, prompt: str) -> list[Path]:
    """Where the prompt's full blocks lie in the folder (the server's own tokens, the store's own key chain)."""
    tokens = httpx.post(f"{url}/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    (identity,) = [p.name for p in folder.iterdir() if p.is_dir()]
    blocks = [tokens[i * BLOCK : (i + 1) * BLOCK] for i in range((len(tokens) - 1) // BLOCK)]
    return [folder / identity / key[:2] / f"{key}.kv" for key in chain(identity, None, blocks)]


def wait_for(files: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(f.is_file() for f in files):
        assert time.monotonic() < deadline, "the blocks were not written"
        time.sleep(0.05)


def pool_size(server) -> str:  # a support.server_helpers.Server
    return re.search(r"KV cache: (\d+) blocks", server.log_path.read_text()).group(1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("prefix") / "kv"


@pytest.fixture(scope="module")
def pair(byte_package, folder, tmp_path_factory):
    """Two servers on one folder, both started before either wrote a block."""
    args = [str(byte_package), "--kv-cache-memory", "64MiB", "--prefix-cache-dir", str(folder)]
    logs = tmp_path_factory.mktemp("logs")
    with running_server(args, logs) as one, running_server(args, logs) as two:
        yield one, two


@pytest.fixture(scope="module")
def restarted(byte_package, folder, pair, tmp_path_factory):
    """A server started with another pool size after the first wrote three prompts' blocks, one of them corrupted
    and one replaced by a FIFO; yields it and the first server's replies."""
    one, _ = pair
    replies = {tag: complete(one.url, text(tag)) for tag in ("restart", "corrupt", "fifo")}
    files = {tag: block_files(one.url, folder, text(tag)) for tag in replies}
    for tag in files:
        wait_for(files[tag])
    data = bytearray(files["corrupt"][1].read_bytes())
    data[-5] ^= 0xFF
    files["corrupt"][1].write_bytes(bytes(data))
    files["fifo"][1].unlink()
    os.mkfifo(files["fifo"][1])  # a plain open() waits for a writer forever
    args = [str(byte_package), "--kv-cache-memory", "16MiB", "--prefix-cache-dir", str(folder)]  # 64MiB caps at 32 MiB
    with running_server(args, tmp_path_factory.mktemp("logs")) as server:
        yield server, replies


def test_a_restart_with_another_pool_size_restores_the_prompt(restarted, pair):
    server, replies = restarted
    assert pool_size(server) != pool_size(pair[0])
    warm = complete(server.url, text("restart"))
    assert cached(replies["restart"]) == 0 and cached(warm) == full(warm) > 0
    assert warm["choices"][0]["text"] == replies["restart"]["choices"][0]["text"]
    assert "prefix cache on disk: " in server.log() and "prefix cache on disk: 0 blocks" not in server.log()
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert metric(metrics, "ortinf:prefix_cache_disk_blocks_restored_total") >= full(warm) // BLOCK
    assert metric(metrics, "ortinf:prefix_cache_disk_bytes") > 0


def test_a_corrupt_block_is_a_miss_with_the_right_reply(restarted):
    server, replies = restarted
    reply = complete(server.url, text("corrupt"))
    assert cached(reply) == BLOCK  # block 0 restored; block 1 fails its checksum: the rest is computed
    assert reply["choices"][0]["text"] == replies["corrupt"]["choices"][0]["text"]


def test_a_fifo_in_place_of_a_block_is_a_miss_not_a_hang(restarted):
    server, replies = restarted
    reply = complete(server.url, text("fifo"), timeout=30)
    assert cached(reply) == BLOCK and reply["choices"][0]["text"] == replies["fifo"]["choices"][0]["text"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_two_servers_on_one_folder_see_each_others_blocks(pair, folder):
    one, two = pair
    first = complete(one.url, text("shared"))
    wait_for(block_files(one.url, folder, text("shared")))
    second = complete(two.url, text("shared"))
    assert cached(first) == 0 and cached(second) == full(second) > 0
    assert second["choices"][0]["text"] == first["choices"][0]["text"]


def test_failed_writes_leave_no_temporary_files(pair, folder):
    one, _ = pair
    complete(one.url, text("warm-up"))  # the folder has its identity's subfolder now
    files = block_files(one.url, folder, text("unwritable"))
    for path in files:  # a directory where each block goes: every write fails at its rename
        path.mkdir(parents=True)
    reply = complete(one.url, text("unwritable"))
    assert cached(reply) == 0
    deadline = time.monotonic() + 30
    while "could not write a block" not in one.log():
        assert time.monotonic() < deadline, one.log()
        time.sleep(0.05)
    time.sleep(0.5)  # the writer is through the prompt's blocks (each fails in microseconds)
    assert not [p for p in folder.rglob("*") if ".tmp" in p.name]
    for path in files:
        path.rmdir()


def test_a_read_only_folder_starts_and_serves(byte_package, folder, pair, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root: chmod does not make a folder read-only")
    one, _ = pair
    expected = complete(one.url, text("read-only"))
    wait_for(block_files(one.url, folder, text("read-only")))
    copy = tmp_path / "kv"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.tmp*"))
    (identity,) = list(copy.iterdir())
    stray = next(identity.glob("*/*.kv")).with_name("0" * 64 + ".tmp1-1")  # a write a crash cut short: the start removes it, or tries
    stray.write_bytes(b"")
    os.utime(stray, (1, 1))
    folders = [copy, identity, *[p for p in identity.iterdir() if p.is_dir()]]
    for path in folders:
        path.chmod(0o555)
    try:
        args = [str(byte_package), "--kv-cache-memory", "64MiB", "--prefix-cache-dir", str(copy), "--prefix-cache-disk", "1KiB"]
        with running_server(args, tmp_path) as server:
            reply = complete(server.url, text("read-only"))
            assert cached(reply) == full(reply) and reply["choices"][0]["text"] == expected["choices"][0]["text"]
            complete(server.url, text("new"))  # nothing can be written, nor evicted: still served
    finally:
        with contextlib.suppress(OSError):
            for path in folders:
                path.chmod(0o755)
