"""The Responses API's store and tenant isolation (issue 41, findings 2-4), on a real server over the
byte-level tiny llama: a stored response no request can rewrite, a store bounded in bytes, and
cache_salt honoured on /v1/responses as on chat and completions."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from support.server_helpers import running_server


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def create(client: httpx.Client, **body) -> dict:
    answer = client.post("/v1/responses", json={"max_output_tokens": 1, "temperature": 0, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def follow_up_tokens(client: httpx.Client, response_id: str) -> int:
    return create(client, previous_response_id=response_id, input="again", store=False)["usage"]["input_tokens"]


def test_a_refused_continuation_leaves_the_stored_response_as_it_was(byte_server):
    """A function_call item on a continuation that is then refused (tool_choice required without tools)
    appended its call to the stored reply, for every later reader; 200 such requests grew memory by
    their arguments, never evicted."""
    with httpx.Client(base_url=byte_server.url, timeout=60) as client:
        first = create(client, input="hi")
        before, stored = follow_up_tokens(client, first["id"]), client.get(f"/v1/responses/{first['id']}").json()
        call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": "' + "x" * 2**20 + '"}'}
        client.post("/v1/responses", json={"previous_response_id": first["id"], "input": [call], "tool_choice": "required"})
        memory = rss(byte_server.process.pid)
        for _ in range(200):
            refused = client.post("/v1/responses", json={"previous_response_id": first["id"], "input": [call],
                                                         "tool_choice": "required"})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "tool_choice", refused.text
        grown = rss(byte_server.process.pid) - memory
        # a branch that runs: a client's call and its result on the stored response, seen by nobody else
        branch = [{"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a": 1}'},
                  {"type": "function_call_output", "call_id": "c2", "output": "done"}]
        create(client, previous_response_id=first["id"], input=branch, store=False)
        assert follow_up_tokens(client, first["id"]) == before
        assert client.get(f"/v1/responses/{first['id']}").json() == stored
    assert grown < 64 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB over 200 refused requests of 1 MiB"


@pytest.fixture(scope="module")
def small_store(byte_package, tmp_path_factory):
    with running_server([str(byte_package), "--kv-cache-memory", "64MiB", "--responses-store-size", "16MiB"],
                        tmp_path_factory.mktemp("logs")) as server:
        yield server


def test_the_store_is_bounded_in_bytes(small_store):
    """150 stored responses carrying a 1.9 MB `user` each: ~285 MB kept by a count bound; 16 MiB here."""
    user = "u" * 1_900_000
    with httpx.Client(base_url=small_store.url, timeout=60) as client:
        create(client, input="warm up", user=user)
        memory = rss(small_store.process.pid)
        ids = [create(client, input="hi", user=user)["id"] for _ in range(150)]
        grown = rss(small_store.process.pid) - memory
        newest = client.get(f"/v1/responses/{ids[-1]}")
        assert newest.status_code == 200 and newest.json()["user"] == user
        assert create(client, previous_response_id=ids[-1], input="again")["previous_response_id"] == ids[-1]
        evicted = client.get(f"/v1/responses/{ids[0]}")
        assert evicted.status_code == 404 and "--responses-store-size" in evicted.json()["error"]["message"]
        kept = sum(client.get(f"/v1/responses/{i}").status_code == 200 for i in ids)
        assert 4 <= kept <= 8  # 16 MiB / 1.9 MB
    assert grown < 96 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB storing 150 x 1.9 MB under a 16 MiB store"


def test_a_response_larger_than_the_store_is_answered_not_stored(small_store):
    with httpx.Client(base_url=small_store.url, timeout=60) as client:
        metadata = {f"k{i}": "v" * 512 for i in range(16)}
        body = create(client, input="hi", metadata=metadata)
        assert body["metadata"] == metadata and client.get(f"/v1/responses/{body['id']}").status_code == 200
        too_long = client.post("/v1/responses", json={"input": "hi", "metadata": {"k": "v" * 513}})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "metadata", too_long.text


def test_cache_salt_isolates_the_prefix_cache_on_responses(byte_server):
    prompt = "a shared system prompt that spans several blocks of the prefix cache. " * 3
    with httpx.Client(base_url=byte_server.url, timeout=60) as client:
        create(client, input=prompt, store=False)
        assert create(client, input=prompt, store=False)["usage"]["input_tokens_details"]["cached_tokens"] > 0
        salted = client.post("/v1/responses", json={"input": prompt, "cache_salt": "tenant-a", "max_output_tokens": 1, "store": False})
        assert salted.status_code == 200 and "x-ignored-fields" not in salted.headers, salted.headers
        assert salted.json()["usage"]["input_tokens_details"]["cached_tokens"] == 0
        again = create(client, input=prompt, cache_salt="tenant-a", store=False)
        assert again["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert create(client, input=prompt, cache_salt="tenant-b", store=False)["usage"]["input_tokens_details"]["cached_tokens"] == 0
