"""What the agent CLIs (Claude Code, Codex) send and read, on every API that serves them (the real app and engine in
process, support/app_helpers.py): system turns inside a conversation, context overflows worded as each API words them,
message_start's usage, Responses namespaces and hosted tools, a tool call cut by max_tokens, cache_salt and document
blocks on /v1/messages. The CLIs themselves run in tests/e2e/test_agent_clis.py where node is present."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from support.app_helpers import serving
from support.recipes import TOOLS_CHAT_TEMPLATE
from tokenizers import Tokenizer

from ortinf.serve.api.openai.responses_tools import read_tools
from ortinf.serve.errors import APIError
from ortinf.serve.state import ServerConfig
from ortinf.tasks.chat.chat import Chat
from ortinf.tasks.chat.messages import ChatMessage
from ortinf.tasks.chat.template import ChatTemplate

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}
SYSTEM_FIRST_ONLY = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                     "{{ raise_exception('System message must be at the beginning') }}{% endif %}"
                     "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
SYSTEM_DROPPED = ("{% if messages[0].role == 'system' %}system: {{ messages[0].content }}\n{% endif %}"
                  "{% for m in messages if m.role != 'system' %}{{ m.role }}: {{ m.content }}\n{% endfor %}")


@pytest.fixture(scope="module")
def anthropic_client(byte_app):
    return byte_app.anthropic()


def _chat(byte_package, source: str) -> tuple[Chat, Tokenizer]:
    tokenizer = Tokenizer.from_file(str(byte_package / "tokenizer.json"))
    return Chat(ChatTemplate(source, "", ""), tokenizer), tokenizer


@pytest.mark.parametrize(("source", "where"), [(TOOLS_CHAT_TEMPLATE, "in place"), (SYSTEM_FIRST_ONLY, "merged"),
                                               (SYSTEM_DROPPED, "merged")])
def test_a_system_turn_inside_the_conversation(byte_package, source, where):
    """Claude Code sends messages[1] as a system turn: where the template writes it, it stays in place; a template that
    refuses it (raise_exception) or leaves it out gets it appended to the leading system prompt."""
    chat, tokenizer = _chat(byte_package, source)
    messages = [ChatMessage(role="system", content="Be brief."), ChatMessage(role="user", content="hi"),
                ChatMessage(role="system", content="Agents: none."), ChatMessage(role="user", content="go")]
    text = tokenizer.decode(chat.prompt(messages), skip_special_tokens=False)
    if where == "in place":
        assert text.index("user: hi") < text.index("system: Agents: none.") < text.index("user: go")
    else:
        assert text.startswith("system: Be brief.\n\nAgents: none.\n") and text.count("system:") == 1, text


def test_messages_take_a_system_turn_and_a_text_document(anthropic_client, byte_app):
    base = [{"role": "user", "content": "hi"}]
    plain = anthropic_client.messages.count_tokens(model="tiny-bytes", messages=base).input_tokens
    system = anthropic_client.messages.count_tokens(model="tiny-bytes", messages=[base[0], {"role": "system", "content": "Agents: none."},
                                                                                   {"role": "user", "content": "go"}]).input_tokens
    assert system > plain + len("Agents: none.go")
    document = {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain", "data": "the sky is green"}}
    read = anthropic_client.messages.count_tokens(model="tiny-bytes", messages=[{"role": "user", "content": [document]}]).input_tokens
    assert read >= len("Notes\nthe sky is green")
    with pytest.raises(anthropic.BadRequestError, match="data must be a string"):
        anthropic_client.messages.create(model="tiny-bytes", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "data": 7}}]}])
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}
    with pytest.raises(anthropic.BadRequestError, match="send its text as a text source"):
        anthropic_client.messages.create(model="tiny-bytes", max_tokens=2, messages=[{"role": "user", "content": [pdf]}])


def test_a_context_overflow_is_worded_as_each_api_words_it(client, anthropic_client, byte_app, model):
    """OpenAI's code context_length_exceeded on chat and Responses; on /v1/messages Anthropic's own sentences, the only
    ones Claude Code recovers from (a smaller max_tokens; compaction for a prompt too long)."""
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=model, messages=ask, max_tokens=5000)
    assert chat.value.code == "context_length_exceeded" and "beyond the context length 1024" in chat.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=model, input="hi", max_output_tokens=5000)
    assert responses.value.code == "context_length_exceeded"
    messages = byte_app.http.post("/v1/messages", json={"model": model, "max_tokens": 32000, "messages": ask})  # the SDK wants a stream
    assert messages.status_code == 400 and messages.json()["error"]["type"] == "invalid_request_error"
    words = messages.json()["error"]["message"]
    assert words.startswith("input length and `max_tokens` exceed context limit: ") and words.split(": ")[1].split(",")[0].endswith(
        " + 32000 > 1024"), words
    with pytest.raises(anthropic.BadRequestError) as long:
        anthropic_client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "x" * 1500}])
    assert long.value.body["error"]["message"].startswith("prompt is too long: "), long.value.body


def test_message_start_carries_the_cache_split(anthropic_client, model):
    """message_start's usage splits the prompt as message_delta's does (Claude Code reads the cache hit from it)."""
    ask = [{"role": "user", "content": "a prompt long enough to fill two cache blocks of sixteen tokens each, or more"}]
    for attempt in range(2):
        with anthropic_client.messages.stream(model=model, max_tokens=3, messages=ask) as stream:
            events = list(stream)
        start = next(e for e in events if e.type == "message_start").message.usage
        delta = next(e for e in events if e.type == "message_delta").usage
        assert (start.input_tokens, start.cache_read_input_tokens) == (delta.input_tokens, delta.cache_read_input_tokens)
    assert start.cache_read_input_tokens >= 32


def test_cache_salt_on_messages(anthropic_client, byte_app, model):
    ask = [{"role": "user", "content": "the salted prompt, long enough for two blocks of the prefix cache to fill up"}]

    def cached(salt: str, header: bool = False) -> int:
        extra = {"extra_headers": {"x-cache-salt": salt}} if header else {"extra_body": {"cache_salt": salt}}
        return anthropic_client.messages.create(model=model, max_tokens=2, messages=ask, **extra).usage.cache_read_input_tokens

    assert cached("alice") == 0 and cached("alice") >= 32  # the second hits under its own salt
    assert cached("bob") == 0 and cached("bob", header=True) >= 32  # the header is the same salt


def test_responses_namespaces_and_hosted_tools(client, byte_app, model):
    """Codex's request: a namespace groups function tools (a call comes back with the function's name and its
    namespace), and the hosted web_search is left out and named in X-Ignored-Fields."""
    tools = [{"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
        {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}]},
        {"type": "web_search", "external_web_access": False}]
    answer = byte_app.http.post("/v1/responses", json={"model": model, "input": "close it", "tools": tools, "tool_choice": "required",
                                                       "max_output_tokens": 60, "temperature": 0})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ignored-fields"].endswith("tools.1 (web_search)")
    (call,) = [item for item in answer.json()["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"]) == ("close_agent", "agents")
    follow = byte_app.http.post("/v1/responses", json={"model": model, "tools": tools, "max_output_tokens": 2, "input": [
        {"type": "message", "role": "user", "content": "close it"}, {k: call[k] for k in ("type", "name", "namespace", "arguments", "call_id")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"},
        {"type": "function_call_output", "name": "goal", "namespace": "agent", "output": "an output no call asked for"}]})
    assert follow.status_code == 200, follow.text


def test_read_tools_names_clashes_and_refuses_hosted_tools_when_asked():
    function = {"type": "function", "name": "close", "parameters": {"type": "object"}}
    read = read_tools([function, {"type": "namespace", "name": "a", "tools": [function]}, {"type": "namespace", "name": "b", "tools": [function]}])
    assert [tool["function"]["name"] for tool in read.chat] == ["close", "a.close", "b.close"]
    assert read.call_item({"type": "function_call", "name": "b.close"}) == {"type": "function_call", "name": "close", "namespace": "b"}
    assert read.model_name("close", "a") == "a.close" and read.model_name("close", None) == "close"
    with pytest.raises(APIError, match="hosted-tools ignore"):
        read_tools([{"type": "file_search"}], "refuse")


def test_a_call_cut_by_max_tokens_is_a_call_on_every_api(client, anthropic_client, byte_app, model):
    """A forced call that max_tokens ends inside its arguments comes back as a call (arguments so far, closed into
    JSON), never as the grammar's JSON in a text block: chat (finish_reason length), Messages (tool_use, stop_reason
    max_tokens), Ollama (tool_calls, done_reason length) and Responses (an incomplete function_call)."""
    ask = [{"role": "user", "content": "weather?"}]
    chat = client.chat.completions.create(model=model, messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=30, temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None, choice
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    message = anthropic_client.messages.create(model=model, max_tokens=30, messages=ask, tools=[tool], tool_choice={"type": "any"},
                                               extra_body={"temperature": 0})
    assert message.stop_reason == "max_tokens" and [block.type for block in message.content] == ["tool_use"], message.content
    assert message.content[0].name == "get_weather" and isinstance(message.content[0].input, dict)
    with anthropic_client.messages.stream(model=model, max_tokens=30, messages=ask, tools=[tool], tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "max_tokens" and streamed.content[0].type == "tool_use"
    response = client.responses.create(model=model, input="weather?", tools=[{"type": "function", **WEATHER["function"]}],
                                       tool_choice="required", max_output_tokens=30, temperature=0)
    assert response.status == "incomplete" and [item.type for item in response.output] == ["function_call"]
    assert response.output[0].status == "incomplete" and isinstance(json.loads(response.output[0].arguments), dict)


def test_ollama_cuts_a_call_under_default_tool_choice_required(byte_package):
    """Ollama's API has no tool_choice: --default-tool-choice required forces a call there too, and max_tokens
    (num_predict) cutting it gives a call (tool_calls, done_reason length), not the grammar's JSON as content."""
    config = ServerConfig(packages=(byte_package,), default_tool_choice="required", engine_options={"kv_cache_memory": "16MiB"})
    with serving(config) as server:
        answer = server.http.post("/api/chat", json={"model": "tiny-bytes", "messages": [{"role": "user", "content": "weather?"}],
                                                     "tools": [WEATHER], "stream": False, "options": {"num_predict": 30, "temperature": 0}})
    body = answer.json()
    assert answer.status_code == 200 and body["done_reason"] == "length", answer.text
    assert body["message"]["content"] == "" and body["message"]["tool_calls"][0]["function"]["name"] == "get_weather", body


def test_tools_a_model_cannot_call_are_said_on_messages(byte_package):
    """tool_choice auto on a model without a tool-call format is answered as text: the OpenAI route said so in a header,
    /v1/messages said nothing."""
    config = ServerConfig(packages=(byte_package,), tool_call_parser="none", engine_options={"kv_cache_memory": "16MiB"})
    with serving(config) as server:
        answer = server.http.post("/v1/messages", json={"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                                                        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]})
    assert answer.status_code == 200 and "no tool-call format" in answer.headers["x-ortinf-warning"]
