"""What the server does with every request field a client may send: the compatibility policy.

Each route's fields fall in one of four kinds (docs/compatibility.md is this table, made by `table()`):
- implemented: a field of the route's request model (ortinf/serve/protocol.py), which does what
  OpenAI or vLLM documents for it;
- mapped: an older spelling read as the implemented one (vLLM's `guided_json` is `structured_outputs.json`);
- ignored: accepted, does nothing here, and is named so: in the `X-Ignored-Fields` response header and
  the server log (as vLLM logs them);
- refused: a field whose meaning this server cannot honour (it would change the output): 400 naming
  the field and what to send instead.

A field in no row is treated as ignored, as vLLM treats unknown fields: a client sending a harmless
default must not break, and the header tells it the field did nothing. tests/serve/test_field_policy.py
checks that every field of every request model has its row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pydantic import BaseModel

from ortinf.serve.errors import APIError

log = logging.getLogger(__name__)

IMPLEMENTED, MAPPED, IGNORED, REFUSED = "implemented", "mapped", "ignored", "refused"
IGNORED_HEADER = "X-Ignored-Fields"
WARNING_HEADER = "X-Ortinf-Warning"  # what the server did instead of what was asked (tool_choice auto without a parser)
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    note: str  # implemented: what it does; mapped: what it becomes; ignored: why; refused: what to send instead


def _implemented(note: str) -> Rule:
    return Rule(IMPLEMENTED, note)


def _ignored(note: str) -> Rule:
    return Rule(IGNORED, note)


def _refused(note: str) -> Rule:
    return Rule(REFUSED, note)


GUIDED = {  # vLLM's guided decoding fields (before structured_outputs), read as structured_outputs
    "guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
}

_SAMPLING = {
    "model": _implemented("the served model or LoRA adapter; optional when one model is served"),
    "temperature": _implemented("0 (or below 1e-5) is greedy"),
    "top_p": _implemented("nucleus sampling"),
    "top_k": _implemented("vLLM's; -1 or 0 is off"),
    "min_p": _implemented("vLLM's"),
    "repetition_penalty": _implemented("vLLM's"),
    "presence_penalty": _implemented("OpenAI's"),
    "frequency_penalty": _implemented("OpenAI's"),
    "seed": _implemented("per-request generator; any integer"),
    "n": _implemented("samples per prompt, 1 to 16"),
    "stop": _implemented("stop strings"),
    "stop_token_ids": _implemented("vLLM's"),
    "ignore_eos": _implemented("vLLM's"),
    "min_tokens": _implemented("vLLM's"),
    "stream": _implemented("server-sent events"),
    "stream_options": _implemented("include_usage, continuous_usage_stats (vLLM's)"),
    "user": _implemented("accepted as OpenAI defines it (an end-user id); logged, no effect on the output"),
    "response_format": _implemented("text, json_object (any JSON object), json_schema: enforced by a grammar"),
    "structured_outputs": _implemented("vLLM's: json, regex, choice, grammar, json_object"),
    "logit_bias": _implemented("token id -> bias"),
    "allowed_token_ids": _implemented("vLLM's"),
    "bad_words": _implemented("vLLM's"),
    "include_stop_str_in_output": _implemented("vLLM's"),
    "skip_special_tokens": _implemented("vLLM's"),
    "prompt_logprobs": _implemented("vLLM's"),
    "truncate_prompt_tokens": _implemented("vLLM's: keep the last k prompt tokens"),
    "priority": _implemented("vLLM's: lower runs first; needs --scheduling-policy priority unless 0"),
    "cache_salt": _implemented("vLLM's: prefix-cache blocks are shared only between requests with the same salt"),
    "request_id": _implemented("vLLM's: the response id's suffix (and the engine's log)"),
    "add_special_tokens": _implemented("vLLM's: add the tokenizer's special tokens (BOS) to the prompt"),
    "best_of": _implemented("with use_beam_search the number of beams; without, accepted when it equals n (or is 1 / null): "
                            "best-of sampling is a 400"),
    "use_beam_search": _implemented("beam search by transformers' rules over max(n, best_of) beams, the n best returned; "
                                    "temperature and top-p/k do not apply; stop strings, logprobs, penalties, logit_bias and "
                                    "response formats are a 400 with it"),
    "length_penalty": _implemented("beam search: sum(logprobs) / length ** length_penalty (default 1.0)"),
    "early_stopping": _implemented("beam search: false (transformers' heuristic), true or \"never\""),
    "store": _ignored("nothing is stored for completions (the Responses API stores: /v1/responses)"),
    "metadata": _ignored("only stored with a stored response"),
    "service_tier": _ignored("one tier"),
    "safety_identifier": _ignored("like user: an end-user id"),
    "prompt_cache_key": _ignored("the prefix cache is automatic; cache_salt isolates"),
    "prompt_cache_retention": _ignored("the prefix cache keeps blocks until their memory is needed"),
    "guided_decoding_backend": _ignored("one structured-output backend (llguidance)"),
    "guided_whitespace_pattern": _ignored("the JSON grammar's whitespace is llguidance's"),
    "spaces_between_special_tokens": _ignored("the tokenizer's decoder decides"),
    "kv_transfer_params": _ignored("no disaggregated prefill"),
    "vllm_xargs": _ignored("no vLLM extensions"),
    "mm_processor_kwargs": _ignored("text models take no multimodal input"),
    "return_tokens_as_token_ids": _refused("read token ids with /tokenize"),
    "structural_tag": _refused("use structured_outputs.grammar (a Lark or GBNF grammar)"),
    **{name: Rule(MAPPED, f"structured_outputs.{target}") for name, target in GUIDED.items()},
}

POLICY: dict[str, dict[str, Rule]] = {
    "/v1/completions": {
        **_SAMPLING,
        "prompt": _implemented("text, token ids, or a list of either"),
        "max_tokens": _implemented("default 16, as OpenAI's"),
        "logprobs": _implemented("top-k logprobs per token"),
        "echo": _implemented("the prompt (and its logprobs) before the completion"),
        "suffix": _refused("it does not fill in the middle: put the text in the prompt"),
    },
    "/v1/chat/completions": {
        **_SAMPLING,
        "messages": _implemented("system, developer, user, assistant, tool; text content parts; image_url parts on "
                                 "vision-language models (base64 data URLs; http(s) URLs from --allowed-media-domains hosts; at "
                                 "most --limit-mm-per-prompt images)"),
        "max_tokens": _implemented("the older name of max_completion_tokens"),
        "max_completion_tokens": _implemented("default: what the context length leaves"),
        "logprobs": _implemented("logprobs of the chosen tokens"),
        "top_logprobs": _implemented("with logprobs"),
        "tools": _implemented("function tools"),
        "tool_choice": _implemented("none, auto (the model's own format, read by the tool-call parser), required, a named function"),
        "parallel_tool_calls": _implemented("false allows one call"),
        "chat_template_kwargs": _implemented("extra chat-template variables"),
        "add_generation_prompt": _implemented("vLLM's"),
        "continue_final_message": _implemented("vLLM's"),
        "reasoning_effort": _implemented("passed to the chat template as reasoning_effort (templates that read it use it)"),
        "modalities": _implemented("[\"text\"] only; audio output is a 400"),
        "prediction": _ignored("predicted outputs: speculative decoding is a server setting (--speculative-*)"),
        "verbosity": _ignored("no verbosity control"),
        "web_search_options": _refused("this server has no web search: drop it"),
        "audio": _refused("this server writes text only: drop it (and modalities audio)"),
        "functions": _refused("the legacy functions field: send tools"),
        "function_call": _refused("the legacy function_call field: send tool_choice"),
        "documents": _refused("pass documents in the messages (or as chat_template_kwargs)"),
        "echo": _refused("vLLM's chat echo is not implemented: use continue_final_message"),
    },
    "/v1/embeddings": {
        "model": _implemented("the served embedding model"),
        "input": _implemented("text, token ids, or a list of either"),
        "encoding_format": _implemented("float or base64"),
        "dimensions": _implemented("the first k dimensions, re-normalised when the model normalises (Matryoshka, as OpenAI's)"),
        "truncate_prompt_tokens": _implemented("vLLM's"),
        "user": _implemented("accepted as OpenAI defines it; no effect"),
        "add_special_tokens": _ignored("embedding inputs always get the model's special tokens, as it was trained"),
        "priority": _ignored("embeddings do not queue in the generation scheduler"),
        "request_id": _ignored("embedding responses have no id"),
    },
    "/v1/responses": {
        "model": _implemented("the served model"),
        "input": _implemented("a string, or items: messages (input_text / output_text parts), function_call, "
                              "function_call_output; reasoning items are skipped"),
        "instructions": _implemented("a system message before the input (not carried to the next response)"),
        "tools": _implemented("function tools; hosted tools (web_search, file_search, ...) are a 400"),
        "tool_choice": _implemented("none, auto, required, a named function"),
        "parallel_tool_calls": _implemented("false allows one call"),
        "text": _implemented("format: text, json_object, json_schema (enforced by a grammar)"),
        "temperature": _implemented("0 is greedy"),
        "top_p": _implemented("nucleus sampling"),
        "max_output_tokens": _implemented("status incomplete when reached"),
        "stream": _implemented("the Responses events"),
        "previous_response_id": _implemented("continues a stored response (in memory, the newest that fit in "
                                             "--responses-store-size)"),
        "store": _implemented("default true: kept (an immutable copy) for GET and previous_response_id"),
        "metadata": _implemented("returned with the response; OpenAI's limits: 16 keys of at most 64 characters, values "
                                 "of at most 512"),
        "user": _implemented("accepted as OpenAI defines it; no effect"),
        "structured_outputs": _implemented("vLLM's, as on chat completions"),
        "cache_salt": _implemented("vLLM's: prefix-cache blocks are shared only between requests with the same salt"),
        **{name: Rule(MAPPED, f"structured_outputs.{target}") for name, target in GUIDED.items()},
        "include": _ignored("no extra output data (logprobs, encrypted reasoning)"),
        "reasoning": _ignored("no reasoning controls"),
        "truncation": _ignored("a conversation longer than the context is a 400"),
        "top_logprobs": _ignored("no logprobs on this route: use /v1/chat/completions"),
        "service_tier": _ignored("one tier"),
        "prompt_cache_key": _ignored("the prefix cache is automatic"),
        "safety_identifier": _ignored("like user"),
        "max_tool_calls": _ignored("one model call per response"),
        "stream_options": _ignored("the events always end with response.completed and its usage"),
        "background": _refused("responses run in the foreground: drop it"),
        "conversation": _refused("no Conversations API: use previous_response_id"),
        "prompt": _refused("no stored prompts: send input and instructions"),
    },
}

POLICY["/v1/messages"] = {  # Anthropic's Messages API (ortinf/serve/anthropic_api.py)
    "model": _implemented("the served model; optional when one model is served"),
    "messages": _implemented("user and assistant turns: text, image (base64; url from --allowed-media-domains hosts), document "
                             "(text and plain-text sources; a PDF is a 400), tool_use and tool_result blocks; earlier turns' "
                             "thinking blocks are dropped, as Anthropic's API does; system turns where the template writes "
                             "them, else in the system prompt"),
    "max_tokens": _implemented("required, as Anthropic's"),
    "system": _implemented("a string or text blocks: the system message"),
    "stop_sequences": _implemented("stop strings; stop_reason stop_sequence names the one matched"),
    "stream": _implemented("Anthropic's events: message_start, content_block_start/delta/stop, message_delta, message_stop"),
    "temperature": _implemented("0 to 1; 0 is greedy"),
    "top_p": _implemented("nucleus sampling"),
    "top_k": _implemented("top-k sampling"),
    "tools": _implemented("client tools (name, description, input_schema); server tools (web_search_..., code_execution_...) "
                          "and tools with defer_loading are left out and named in X-Ignored-Fields (--hosted-tools refuse: "
                          "a 400)"),
    "cache_salt": _implemented("vLLM's: prefix-cache blocks are shared only between requests with the same salt (or the "
                               "x-cache-salt header); cache_read_input_tokens then tells nothing across salts"),
    "tool_choice": _implemented("auto (read by the tool-call parser), any and tool (enforced by a grammar), none; "
                                "disable_parallel_tool_use allows one call"),
    "thinking": _implemented("enabled, adaptive, between_tools or disabled: the chat template's enable_thinking; thinking "
                             "blocks come from --reasoning-parser; budget_tokens and display are not enforced"),
    "output_config": _implemented("format (json_schema: enforced by a grammar); effort: the chat template's reasoning_effort"),
    "metadata": _ignored("user_id identifies an end user; no effect on the output"),
    "service_tier": _ignored("one tier"),
    "speed": _ignored("one speed"),
    "inference_geo": _ignored("it runs here"),
    "diagnostics": _ignored("no prompt-cache divergence reports"),
    "user_profile_id": _ignored("no user profiles"),
    "workspace_id": _ignored("no workspaces"),
    "context_management": _ignored("the conversation is rendered as sent"),
    "cache_control": _ignored("the prefix cache is automatic"),
    "container": _refused("this server runs no code-execution container: drop it"),
    "mcp_servers": _refused("this server connects to no MCP server: call the tools from the client"),
}
POLICY["/v1/messages/count_tokens"] = POLICY["/v1/messages"]

_OLLAMA = {  # what /api/chat and /api/generate share (ortinf/serve/ollama_api.py)
    "model": _implemented("the served name (a trailing :latest is accepted)"),
    "stream": _implemented("NDJSON lines, the last with done true; default true, as Ollama's"),
    "format": _implemented("\"json\" (any JSON object) or a JSON schema: enforced by a grammar"),
    "options": _implemented("temperature, top_p, top_k, min_p, seed, num_predict (stops at the context's end, done_reason "
                            "length, as Ollama), stop, repeat_penalty, presence_penalty, frequency_penalty, cache_salt; the "
                            "runner's (num_ctx, num_gpu, num_thread, ...) are named as ignored (options.NAME): the server's "
                            "options set them"),
    "think": _implemented("true/false: the chat template's enable_thinking; low/medium/high also its reasoning_effort; thinking "
                          "comes from --reasoning-parser"),
    "keep_alive": _implemented("with --models-dir: how long the model stays loaded once idle after this request (seconds or "
                               "5m/1h30m; negative or longer than Go's longest duration (~292 years): stays; 0: unloads at "
                               "once; NaN or infinite: a 400); without it every model stays loaded"),
    "logprobs": _implemented("each line's tokens with their logprob and bytes, as Ollama's logprobs list"),
    "top_logprobs": _implemented("0 to 20 alternatives per token, with logprobs true"),
    "cache_salt": _implemented("vLLM's (also as options.cache_salt): prefix-cache blocks are shared only between requests with "
                               "the same salt"),
}
POLICY["/api/chat"] = {
    **_OLLAMA,
    "messages": _implemented("system, user, assistant (with tool_calls), tool (tool_name); images as base64 on vision models; "
                             "none: the model's load answer (done_reason load)"),
    "tools": _implemented("function tools; the model's calls are read by the tool-call parser"),
}
POLICY["/api/generate"] = {
    **_OLLAMA,
    "prompt": _implemented("rendered as a user turn through the chat template, or as it is with raw (or without a template); "
                           "empty: the model's load answer (done_reason load)"),
    "system": _implemented("a system turn before the prompt"),
    "images": _implemented("base64 images on vision models"),
    "raw": _implemented("the prompt as it is, no template"),
    "context": _ignored("Ollama's deprecated token context: send the conversation to /api/chat"),
    "suffix": _refused("no fill-in-the-middle: put the text in the prompt"),
    "template": _refused("the package's chat template renders prompts: send raw: true with the prompt formatted"),
    "width": _refused("no image generation"),
    "height": _refused("no image generation"),
    "steps": _refused("no image generation"),
}
POLICY["/api/embed"] = {
    "model": _implemented("the served embedding model"),
    "input": _implemented("a string or a list of strings"),
    "truncate": _implemented("default true: inputs past the context length are cut; false: they are a 400"),
    "dimensions": _implemented("the first k dimensions, re-normalised when the model normalises"),
    "options": _ignored("embeddings take no sampling options"),
    "keep_alive": _implemented("as on /api/chat"),
}
POLICY["/api/embeddings"] = {
    "model": _implemented("the served embedding model"),
    "prompt": _implemented("one text"),
    "options": _ignored("embeddings take no sampling options"),
    "keep_alive": _implemented("as on /api/chat"),
}
POLICY["/api/show"] = {
    "model": _implemented("the served name"),
    "name": _implemented("the older spelling of model"),
    "verbose": _ignored("model_info holds what there is"),
}


MAX_UNKNOWN_FIELDS = 256  # a request with more fields outside its model is refused before any is sorted or escaped


def apply(route: str, body: BaseModel) -> list[str]:
    """The fields of `body` this server ignores (refused ones raise APIError 400). `body` is a request
    model with extra="allow": fields outside the model are in `model_extra`. More than MAX_UNKNOWN_FIELDS of
    them is a 400 at once (an outside attack sent 150,000: sorting and escaping their names for the log and the
    header held the event loop, /health took 1.1 s)."""
    rules = POLICY[route]
    extra = body.model_extra or {}
    if len(extra) > MAX_UNKNOWN_FIELDS:
        raise APIError(400, f"the request has {len(extra):,} fields this route does not define (at most {MAX_UNKNOWN_FIELDS}): "
                            "send the documented fields only (docs/compatibility.md)")
    ignored = []
    for name, value in extra.items():
        rule = rules.get(name)
        if rule is not None and rule.kind == REFUSED:
            if value is None or value is False or value == "":
                ignored.append(name)  # a client's explicit "off" of a feature this server lacks asks for nothing
                continue
            raise APIError(400, f"{name} is not supported by this server: {rule.note}", param=name)
        ignored.append(name)
    if ignored:
        log.warning("%s: ignored request fields %s", route, printable(ignored))
    return ignored


def ignored_headers(ignored: list[str]) -> dict[str, str]:
    """The response header naming the ignored fields (none when there are none). A header is printable
    ASCII: other characters of a (client-chosen) field name are escaped, and the list is capped."""
    return {IGNORED_HEADER: printable(ignored)} if ignored else {}


def printable(names: list[str]) -> str:
    """Field names as one line of printable ASCII (for a header or the log), at most 1,000 characters."""
    escaped = (name.encode("ascii", "backslashreplace").decode("ascii") for name in sorted(names))
    return ", ".join("".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in name) for name in escaped)[:1000]


def warn_once(message: str) -> None:
    """Logs a warning the first time it happens (a response header carries it every time)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def table() -> str:
    """The policy as Markdown (docs/compatibility.md holds it; a docs test keeps them equal)."""
    lines = []
    for route, rules in POLICY.items():
        lines += [f"### `{route}`", "", "| field | policy | note |", "|---|---|---|"]
        lines += [f"| `{name}` | {rule.kind} | {rule.note} |" for name, rule in rules.items()]
        lines.append("")
    return "\n".join(lines)
