"""Property-based fuzzing of /v1/completions, /v1/chat/completions, /v1/responses, /v1/embeddings and the scoring routes
(/v1/rerank, /score, /classify) on the real server.

Every field is drawn across (and beyond) its schema range: extreme ints, tiny and huge floats, odd
unicode (lone surrogates, NULs, emoji), huge lists, token ids off the vocabulary, wrong types and
fields the server does not implement. The property: no answer is a 5xx, every error is OpenAI-shaped,
every stream ends with [DONE] and no error event; after the run /health is 200 and a greedy request
returns the reference text. The default suite runs a few hundred cases (derandomised, so CI is
reproducible); `pytest -m slow` runs several thousand random ones.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.server_helpers import running_server

from ortinf import LLM, SamplingParams

MODEL = "tiny-llama"
DEFAULT_EXAMPLES = int(os.environ.get("ORTINF_FUZZ_EXAMPLES", "300"))  # per endpoint
SLOW_EXAMPLES = int(os.environ.get("ORTINF_FUZZ_SLOW_EXAMPLES", "2500"))
OK_STATUSES = {200, 400, 404, 413, 429}
GREEDY = {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}

extreme_ints = st.sampled_from([-(2**63), 2**63 - 1, 2**63, 2**64, -(2**64), 10**30, -1, 0, 1, 2**31])
ints = st.one_of(st.integers(-3, 40), st.integers(), extreme_ints)
small_counts = st.one_of(st.integers(0, 6), ints)
floats = st.one_of(
    st.floats(-3, 3), st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1e-39, 5e-324, 1e-6, 1e-5, 1e308, -0.0, 2.0, 2.0000001]),
)
odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "\ud800", "\udfff\ud800", "🦊" * 30, "\u202e\u200b", "def ", "\n\n\n", "</s>", "<s>"]),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=200, max_size=2000),
)
token_id = st.one_of(st.integers(0, 255), st.integers(-5, 100_000), extreme_ints)
token_ids = st.one_of(st.lists(token_id, min_size=0, max_size=40), st.lists(st.integers(0, 255), min_size=400, max_size=3000))
junk = st.one_of(st.none(), st.booleans(), ints, floats, odd_text, st.lists(ints, max_size=5), st.dictionaries(st.text(max_size=5), ints, max_size=3))


def odd_key() -> str:
    """A field name no route knows (unknown fields are ignored and named in a header: it must stay a valid header)."""
    return "\u00e9t\u00e9 \ud800 x"


def maybe(strategy):
    """Mostly well-typed values, sometimes junk of any type."""
    return st.one_of(strategy, strategy, strategy, junk)


SAMPLING = {
    "model": st.one_of(st.just(MODEL), st.just(MODEL), st.just(MODEL), odd_text, st.none()),
    "max_tokens": maybe(small_counts),
    "temperature": maybe(floats),
    "top_p": maybe(floats),
    "top_k": maybe(ints),
    "min_p": maybe(floats),
    "repetition_penalty": maybe(floats),
    "presence_penalty": maybe(floats),
    "frequency_penalty": maybe(floats),
    "seed": maybe(ints),
    "n": maybe(st.one_of(st.integers(1, 3), ints)),
    "stop": maybe(st.one_of(odd_text, st.lists(odd_text, max_size=70))),
    "stop_token_ids": maybe(st.lists(token_id, max_size=70)),
    "ignore_eos": maybe(st.booleans()),
    "min_tokens": maybe(small_counts),
    "stream": maybe(st.booleans()),
    "stream_options": maybe(st.fixed_dictionaries({}, optional={"include_usage": maybe(st.booleans())})),
    "user": maybe(odd_text),
    "response_format": st.just({"type": "json_object"}),
    "logit_bias": st.dictionaries(st.text(max_size=4), floats, max_size=3),
}
# In-range values with their edges: these reach the engine (sampling, stop rules, logprobs, seeds).
unit = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 1e-39, 5e-324, 0.5]))
IN_RANGE = {
    "model": st.just(MODEL),
    "max_tokens": st.one_of(st.integers(0, 8), st.integers(0, 600)),
    "temperature": st.one_of(st.floats(0, 2), st.sampled_from([0.0, 1e-39, 5e-324, 1e-6, 1e-5, 2.0])),
    "top_p": unit.filter(lambda p: p > 0),
    "top_k": st.one_of(st.integers(-1, 300), extreme_ints.filter(lambda k: k >= -1)),
    "min_p": unit,
    "repetition_penalty": st.one_of(st.floats(1e-3, 5), st.sampled_from([5e-324, 1e-30, 1e30, 1e308])),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "seed": st.one_of(st.integers(), extreme_ints),
    "n": st.integers(1, 3),
    "stop": st.one_of(odd_text, st.lists(odd_text, max_size=5)),
    "stop_token_ids": st.one_of(st.lists(st.integers(0, 255), max_size=5), st.lists(token_id, max_size=5)),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
in_range_ids = st.one_of(st.lists(st.integers(0, 255), min_size=1, max_size=300), st.lists(token_id, min_size=1, max_size=10))
IN_RANGE_COMPLETION = st.fixed_dictionaries(
    {"prompt": st.one_of(odd_text, in_range_ids, st.lists(st.one_of(odd_text, in_range_ids), min_size=1, max_size=4))},
    optional={**IN_RANGE, "logprobs": st.integers(0, 20), "echo": st.booleans()},
)
COMPLETION = st.one_of(
    IN_RANGE_COMPLETION, IN_RANGE_COMPLETION, IN_RANGE_COMPLETION,  # 3 of 4 cases reach the engine
    st.fixed_dictionaries(
        {"prompt": maybe(st.one_of(odd_text, token_ids, st.lists(odd_text, max_size=4), st.lists(token_ids, max_size=4),
                                   st.lists(st.just("x"), min_size=250, max_size=300)))},
        optional={**SAMPLING, "logprobs": maybe(st.integers(-1, 21)), "echo": maybe(st.booleans()), "suffix": maybe(odd_text)},
    ),
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), odd_text),
     "content": st.one_of(odd_text, st.none(), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": odd_text}), max_size=3), junk)},
    optional={"name": maybe(odd_text), "tool_calls": st.just([])},
)
IN_RANGE_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": st.one_of(odd_text, st.none(), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": odd_text}), max_size=3))},
)
IN_RANGE_CHAT = st.fixed_dictionaries(
    {"messages": st.lists(IN_RANGE_MESSAGE, min_size=1, max_size=6)},
    optional={**IN_RANGE, "max_completion_tokens": st.integers(1, 8), "logprobs": st.just(True), "top_logprobs": st.integers(0, 20)},
)
CHAT = st.one_of(
    IN_RANGE_CHAT, IN_RANGE_CHAT, IN_RANGE_CHAT,
    st.fixed_dictionaries(
        {"messages": maybe(st.lists(MESSAGE, min_size=0, max_size=6))},
        optional={**SAMPLING, "max_completion_tokens": maybe(small_counts), "logprobs": maybe(st.booleans()),
                  "top_logprobs": maybe(st.integers(-1, 21)), "tools": st.just([{"type": "function"}])},
    ),
)

ITEM = st.one_of(
    st.fixed_dictionaries({"role": maybe(st.sampled_from(["user", "system", "developer", "assistant"])),
                           "content": st.one_of(odd_text, st.lists(st.fixed_dictionaries({"type": maybe(st.sampled_from(
                               ["input_text", "output_text", "input_image", "refusal"])), "text": maybe(odd_text)}), max_size=3), junk)},
                          optional={"type": maybe(st.just("message"))}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": maybe(odd_text), "name": maybe(odd_text),
                           "arguments": maybe(odd_text)}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": maybe(odd_text), "output": maybe(odd_text)}),
    st.fixed_dictionaries({"type": maybe(odd_text)}),
    junk,
)
IN_RANGE_RESPONSES = st.fixed_dictionaries(
    {"input": st.one_of(st.text(min_size=1, max_size=40), st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(min_size=1, max_size=40)}), min_size=1, max_size=4))},
    optional={"max_output_tokens": st.integers(1, 8), "temperature": st.floats(0, 2), "stream": st.booleans(), "store": st.booleans(),
              "instructions": st.text(max_size=20), "tool_choice": st.sampled_from(["auto", "none"]),
              "text": st.just({"format": {"type": "json_object"}})},
)
RESPONSES = st.one_of(IN_RANGE_RESPONSES, IN_RANGE_RESPONSES, st.fixed_dictionaries(
    {"input": maybe(st.one_of(odd_text, st.lists(ITEM, max_size=5)))},
    optional={"model": SAMPLING["model"], "instructions": maybe(odd_text), "max_output_tokens": maybe(st.one_of(st.integers(1, 8), ints)),
              "temperature": maybe(floats), "top_p": maybe(floats), "stream": maybe(st.booleans()), "store": maybe(st.booleans()),
              "previous_response_id": maybe(odd_text), "metadata": maybe(st.dictionaries(odd_text, odd_text, max_size=20)),
              "tools": maybe(st.lists(st.fixed_dictionaries({"type": maybe(st.sampled_from(["function", "web_search"])),
                                                             "name": maybe(odd_text)}), max_size=3)),
              "tool_choice": maybe(st.sampled_from(["auto", "none", "required"])),
              "text": maybe(st.fixed_dictionaries({"format": maybe(st.fixed_dictionaries({"type": maybe(st.sampled_from(
                  ["text", "json_object", "json_schema"]))}))})),
              "reasoning": junk, "include": junk, "background": junk, odd_key(): junk},
))


EMBEDDING = st.fixed_dictionaries(
    {"input": maybe(st.one_of(odd_text, st.lists(odd_text, min_size=1, max_size=40), token_ids,
                              st.lists(st.lists(st.integers(0, 30_521), min_size=1, max_size=300), min_size=1, max_size=8),
                              st.lists(token_ids, max_size=4), st.lists(st.just("x"), min_size=2040, max_size=2060)))},
    optional={"model": st.one_of(st.just("minilm"), st.just("minilm"), st.just(MODEL), odd_text),
              "encoding_format": maybe(st.sampled_from(["float", "base64"])), "dimensions": maybe(st.one_of(st.just(384), ints)),
              "truncate_prompt_tokens": maybe(ints), "user": maybe(odd_text), "response_format": st.just("json")},
)

SCORING = st.one_of(
    st.fixed_dictionaries({"query": maybe(odd_text), "documents": maybe(st.one_of(
        st.lists(odd_text, max_size=8), st.lists(st.fixed_dictionaries({"text": maybe(odd_text)}), max_size=4),
        st.lists(st.just("x"), min_size=2040, max_size=2060)))},
        optional={"model": st.one_of(st.just("minilm"), st.just("minilm"), st.just(MODEL), odd_text), "top_n": maybe(ints),
                  "return_documents": maybe(st.booleans()), odd_key(): junk}),
    st.fixed_dictionaries({"text_1": maybe(st.one_of(odd_text, st.lists(odd_text, max_size=4))),
                           "text_2": maybe(st.one_of(odd_text, st.lists(odd_text, max_size=4)))},
                          optional={"model": st.one_of(st.just("minilm"), st.just(MODEL), odd_text)}),
)


@pytest.fixture(scope="module")
def fuzz_server(chat_package, minilm_package, tmp_path_factory):
    args = [str(chat_package), str(minilm_package), "--served-model-name", MODEL, "--served-model-name", "minilm",
            "--kv-cache-memory", "32MiB", "--max-num-seqs", "16", "--max-queued-requests", "64"]
    with running_server(args, tmp_path_factory.mktemp("fuzz-logs")) as server:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            server.client = client  # type: ignore[attr-defined]
            yield server


@pytest.fixture(scope="module")
def reference(chat_package) -> str:
    llm = LLM(chat_package, provider="cpu", num_blocks=64)
    return llm.generate(GREEDY["prompt"], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text


def check(client: httpx.Client, path: str, body: dict) -> None:
    content = json.dumps(body, allow_nan=True)  # NaN and Infinity are not JSON: the server must say 400
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code in OK_STATUSES, f"{response.status_code} for {content[:500]}: {response.text[:500]}"
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], response.text
        return
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]  # SSE splits on newlines only
        if path == "/v1/responses":  # typed events, no [DONE]: the last is the response's end
            kinds = [json.loads(event)["type"] for event in events]
            assert kinds and kinds[-1] in ("response.completed", "response.incomplete"), f"{content[:500]}: {kinds}"
            return
        assert events and events[-1] == "[DONE]", response.text[-500:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), f"error event for {content[:500]}: {event[:500]}"
    elif path == "/v1/responses":
        assert response.json()["object"] == "response", response.text[:500]
    elif path in ("/v1/rerank", "/score"):
        assert "results" in response.json() or "data" in response.json(), response.text[:500]
    elif path == "/v1/embeddings":
        assert response.json()["data"], response.text[:500]
    else:
        assert response.json()["choices"], response.text[:500]


def assert_serving(server, reference: str) -> None:
    client = server.client
    assert client.get("/health").status_code == 200, server.log()
    response = client.post("/v1/completions", json=GREEDY)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == reference, server.log()


def fuzz(server, reference: str, path: str, strategy, examples: int, derandomize: bool) -> None:
    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(body=strategy)
    def run(body: dict) -> None:
        check(server.client, path, body)

    run()
    assert_serving(server, reference)


def test_fuzz_completions(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/completions", COMPLETION, DEFAULT_EXAMPLES, derandomize=True)


def test_fuzz_chat_completions(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/chat/completions", CHAT, DEFAULT_EXAMPLES, derandomize=True)


def test_fuzz_responses(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/responses", RESPONSES, DEFAULT_EXAMPLES // 3, derandomize=True)


@pytest.mark.slow
def test_fuzz_responses_thousands(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/responses", RESPONSES, SLOW_EXAMPLES // 2, derandomize=False)


def test_fuzz_scoring(fuzz_server, reference):
    """One strategy for both bodies: /v1/rerank gets the score body too (a 400), and the other way round below."""
    fuzz(fuzz_server, reference, "/v1/rerank", SCORING, DEFAULT_EXAMPLES // 6, derandomize=True)
    fuzz(fuzz_server, reference, "/score", SCORING, DEFAULT_EXAMPLES // 6, derandomize=True)


def test_fuzz_embeddings(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/embeddings", EMBEDDING, DEFAULT_EXAMPLES // 3, derandomize=True)


@pytest.mark.slow
def test_fuzz_embeddings_thousands(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/embeddings", EMBEDDING, SLOW_EXAMPLES // 2, derandomize=False)


@pytest.mark.slow
def test_fuzz_completions_thousands(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/completions", COMPLETION, SLOW_EXAMPLES, derandomize=False)


@pytest.mark.slow
def test_fuzz_chat_completions_thousands(fuzz_server, reference):
    fuzz(fuzz_server, reference, "/v1/chat/completions", CHAT, SLOW_EXAMPLES, derandomize=False)
