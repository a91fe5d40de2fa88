"""`ortinf serve --models-dir DIR` (ortinf/serve/model_manager.py) on a real server: three packages and a broken one
under a one-model limit. Listed before any loads; requests to each in turn load and unload them; requests that come
while a model loads wait and succeed; the broken package is an error for its own requests only; an idle model
unloads and its memory goes back (the server's RSS, measured); Ollama's keep_alive and /api/ps say the same. Clients that
alternate two models under the limit all get their answers; a request must name its model here."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.server_helpers import metric, running_server

ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def models_dir(byte_package, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta", "gamma"):
        shutil.copytree(byte_package, folder / name)
    shutil.copytree(byte_package, folder / "broken")
    for graph in (folder / "broken").glob("*.onnx"):  # its manifest reads; its graphs do not load
        graph.write_bytes(b"not an onnx graph")
    (folder / "notes.txt").write_text("not a model")
    return folder


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    args = ["--models-dir", str(models_dir), "--max-loaded-models", "1", "--kv-cache-memory", "64MiB", "--max-num-seqs", "8"]
    with running_server(args, tmp_path_factory.mktemp("logs")) as server:
        yield server


def chat(url: str, model: str, **fields) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": ASK, "max_tokens": 4, **fields}, timeout=120)


def loaded(url: str) -> set[str]:
    return {card["id"] for card in httpx.get(f"{url}/v1/models").json()["data"] if card["loaded"]}


def rss(server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_models_are_listed_before_any_loads(server):
    cards = {card["id"]: card for card in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert set(cards) == {"alpha", "beta", "gamma", "broken"} and not any(card["loaded"] for card in cards.values())
    assert cards["alpha"]["task"] == "text-generation" and cards["alpha"]["max_model_len"] == 1024
    assert {m["name"] for m in httpx.get(f"{server.url}/api/tags").json()["models"]} == set(cards)
    assert httpx.get(f"{server.url}/api/ps").json()["models"] == []


def test_one_at_a_time_in_turn(server):
    greedy = {"temperature": 0}
    first = chat(server.url, "alpha", **greedy)
    assert first.status_code == 200 and loaded(server.url) == {"alpha"}
    assert chat(server.url, "beta", **greedy).status_code == 200 and loaded(server.url) == {"beta"}  # alpha made room
    again = chat(server.url, "alpha", **greedy)
    assert again.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    text = httpx.get(f"{server.url}/metrics").text
    assert metric(text, "ortinf:models_loaded") == 1 and metric(text, "ortinf:model_loads_total") >= 3
    assert [m["name"] for m in httpx.get(f"{server.url}/api/ps").json()["models"]] == ["alpha"]


def test_requests_that_come_while_a_model_loads_wait_and_succeed(server):
    answers: list[int] = []

    def ask() -> None:
        answers.append(chat(server.url, "gamma").status_code)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200] * 4 and loaded(server.url) == {"gamma"}
    assert metric(httpx.get(f"{server.url}/metrics").text, "ortinf:model_loads_total") >= 4  # gamma loaded once for the four


def test_a_broken_package_fails_its_own_requests_only(server):
    broken = chat(server.url, "broken")
    assert broken.status_code == 500
    error = broken.json()["error"]
    assert error["code"] == "model_load_failed" and "broken" in error["message"]
    assert chat(server.url, "alpha").status_code == 200  # the others go on
    assert httpx.get(f"{server.url}/health").status_code == 200
    ollama = httpx.post(f"{server.url}/api/chat", json={"model": "broken", "messages": ASK, "stream": False})
    assert ollama.status_code == 500 and "could not be loaded" in ollama.json()["error"]


def test_idle_unload_and_keep_alive_free_the_memory(models_dir, tmp_path):
    args = ["--models-dir", str(models_dir), "--kv-cache-memory", "256MiB", "--idle-unload", "1"]
    with running_server(args, tmp_path) as server:
        base = rss(server)
        sizes = []
        for _ in range(2):  # the first load also imports what every load needs: the second cycle is the measure
            assert chat(server.url, "alpha").status_code == 200
            held = rss(server)
            deadline = time.monotonic() + 30
            while loaded(server.url):
                assert time.monotonic() < deadline, "alpha did not unload when idle"
                time.sleep(0.2)
            time.sleep(1.5)  # its engines stop in a worker thread after it leaves the list
            sizes.append((held, rss(server)))
        (_, after_first), (held, after_second) = sizes
        assert held - after_second > 16 << 20, (base, sizes)  # the model's memory went back ...
        assert after_second - after_first < 16 << 20, (base, sizes)  # ... and nothing stays behind per load
        reply = httpx.post(f"{server.url}/api/chat", json={"model": "beta", "messages": ASK, "stream": False, "keep_alive": "1h",
                                                            "options": {"num_predict": 2}})
        assert reply.status_code == 200
        time.sleep(2)  # past --idle-unload: keep_alive holds it
        (ps,) = httpx.get(f"{server.url}/api/ps").json()["models"]
        assert ps["name"] == "beta" and ps["expires_at"] > "2026"
        httpx.post(f"{server.url}/api/generate", json={"model": "beta", "prompt": "x", "stream": False, "keep_alive": 0,
                                                         "options": {"num_predict": 1}})
        deadline = time.monotonic() + 10
        while loaded(server.url):
            assert time.monotonic() < deadline, "keep_alive 0 did not unload beta"
            time.sleep(0.1)


def test_models_dir_options_are_checked_in_one_line(tmp_path):
    import subprocess
    import sys

    ortinf = str(Path(sys.executable).with_name("ortinf"))
    for args, fragment in ((["--max-loaded-models", "2"], "--max-loaded-models applies to --models-dir"),
                           (["--models-dir", str(tmp_path / "nope")], "no such folder")):
        done = subprocess.run([ortinf, "serve", *args, "--port", "8798"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_load_is_timed_in_the_log_and_in_ollamas_durations(server):
    """The request that loads a model reports the load as Ollama does (load_duration within total_duration), the next
    one none; /api/ps and the log give the load's seconds, the log the package's weight bytes beside the resident ones."""
    httpx.post(f"{server.url}/api/generate", json={"model": "beta", "keep_alive": 0})  # not loaded, whatever ran before
    deadline = time.monotonic() + 10
    while "beta" in loaded(server.url):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    first = httpx.post(f"{server.url}/api/generate", json={"model": "beta"}, timeout=120).json()
    assert first["done_reason"] == "load" and 0 < first["load_duration"] <= first["total_duration"]
    ask = {"model": "beta", "messages": ASK, "stream": False, "options": {"num_predict": 2}}
    warm = httpx.post(f"{server.url}/api/chat", json=ask, timeout=120).json()
    assert warm["load_duration"] == 0 and warm["total_duration"] > 0
    (ps,) = [m for m in httpx.get(f"{server.url}/api/ps").json()["models"] if m["name"] == "beta"]
    assert ps["load_duration"] > 0
    line = next(line for line in reversed(server.log().splitlines()) if "loaded 'beta' in" in line)
    assert "of weights in the package" in line and "more resident in this process" in line, line


def test_concurrent_clients_alternating_two_models_all_succeed(server):
    """A model loaded for waiting requests is theirs until they lease it: the next queued load cannot unload it as
    idle first (each client's requests: 404 model_not_found for models that exist, 4 of 6 with two clients)."""
    answers: list[tuple[str, int, str]] = []

    def client(first: int) -> None:
        for turn in range(4):
            model = ("alpha", "beta")[(first + turn) % 2]
            reply = chat(server.url, model)
            answers.append((model, reply.status_code, reply.text[:200] if reply.status_code != 200 else ""))

    threads = [threading.Thread(target=client, args=(first,)) for first in (0, 1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 12 and all(status == 200 for _, status, _ in answers), answers


def test_a_request_must_name_its_model(server):
    """Under --models-dir, "the only model" is whichever another client loaded last: a request without `model` is a
    400 that says where the names are, whatever is loaded."""
    assert chat(server.url, "alpha").status_code == 200  # one model loaded: the old fallback would answer with it
    reply = httpx.post(f"{server.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 2}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "model" and "/v1/models" in error["message"], error


def test_the_start_line_names_the_models_folder(server, models_dir):
    line = next(line for line in server.log_path.read_text().splitlines() if "ready: serving" in line)
    assert f"ready: serving the models folder {models_dir} (4 models" in line and " on http://127.0.0.1:" in line, line


def test_serve_help_names_the_three_apis():
    import subprocess
    import sys

    ortinf = str(Path(sys.executable).with_name("ortinf"))
    done = subprocess.run([ortinf, "serve", "--help"], capture_output=True, text=True, timeout=120)
    words = " ".join(done.stdout.split())
    assert done.returncode == 0 and "OpenAI" in words and "Anthropic" in words and "Ollama" in words, done.stdout[:600]
    assert "/v1/messages" in words and "/api/chat" in words
