"""A Messages request read into the chat completion it means: system (a top-level field, or turns inside the
conversation), turns, images, text documents, tool_use and tool_result blocks as OpenAI's messages; tools and
tool_choice as OpenAI's (server tools left out or refused, --hosted-tools); thinking and output_config as the chat
template's variables and a response format."""

from __future__ import annotations

import json

from ortinf.serve.api.anthropic.protocol import MessagesRequest
from ortinf.serve.errors import APIError
from ortinf.serve.generation import as_chat_request
from ortinf.serve.protocol import ChatCompletionRequest

THINKING = ("enabled", "adaptive", "between_tools", "disabled")  # thinking.type: every kind but disabled lets the model think


def _text_of(blocks, where: str) -> str:
    """The text of a string or of a list of text blocks (a system prompt, a tool result)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise APIError(400, f"{where} must be a string or a list of text blocks", param=where)
    texts = []
    for index, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise APIError(400, f"{where}.{index}: a block of type '{str(kind)[:40]}' cannot go here: send text blocks "
                                "(an image goes in a user message)", param=where)
        texts.append(block["text"])
    return "\n".join(texts)


def _image(block: dict, where: str) -> dict:
    source = block.get("source")
    if not isinstance(source, dict):
        raise APIError(400, f"{where}.source: an image block needs a source", param=where)
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type") or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{source['data']}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise APIError(400, f"{where}.source: send a base64 source (type, media_type, data) or a url source (type, url)", param=where)


def _document(block: dict, where: str) -> str:
    """A document block's text (a text source, or a content source of text blocks), after its title and context."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text":
        if not isinstance(source.get("data"), str):
            raise APIError(400, f"{where}.source.data: a text document's data must be a string", param=where)
        text = source["data"]
    elif kind == "content":
        text = _text_of(source.get("content"), f"{where}.source.content")
    else:
        raise APIError(400, f"{where}.source: a document of source type '{str(kind)[:40]}' cannot be read here (a PDF has no "
                            "text this server extracts): send its text as a text source (type text, media_type text/plain, data)",
                       param=where)
    head = [value for value in (block.get("title"), block.get("context")) if isinstance(value, str) and value]
    return "\n".join([*head, text])


def _turn(message: dict, index: int) -> list[dict]:
    """One Anthropic message as OpenAI chat messages: a user turn's tool results become tool messages (before its
    other content), an assistant turn's tool_use blocks its tool calls; thinking blocks of earlier turns are dropped
    (as Anthropic's own API drops them from the prompt of earlier turns)."""
    where = f"messages.{index}"
    role, content = message.get("role") if isinstance(message, dict) else None, message.get("content") if isinstance(message, dict) else None
    if role == "system":  # Claude Code's mid-conversation system messages: at their position where the template allows
        return [{"role": "system", "content": _text_of(content if content is not None else "", f"{where}.content")}]
    if role not in ("user", "assistant"):  # Anthropic's wording
        raise APIError(400, f"{where}.role: Input should be 'user' or 'assistant'", param=f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
    parts, calls, results = [], [], []
    for position, block in enumerate(content):
        at = f"{where}.content.{position}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "document" and role == "user":
            parts.append({"type": "text", "text": _document(block, at)})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise APIError(400, f"{at}: a tool_use block needs an id and a name", param=at)
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise APIError(400, f"{at}: a tool_result block needs the tool_use_id it answers", param=at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _text_of(block.get("content") or "", at)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise APIError(400, f"{at}: a {role} message cannot hold a block of type '{str(kind)[:40]}' here (text, image, "
                                "document and tool_result in user turns; text, tool_use and thinking in assistant turns)", param=at)
    turns = list(results)
    if parts or (role == "assistant" and calls) or not results:
        text_only = all(p["type"] == "text" for p in parts)
        body: dict = {"role": role, "content": "".join(p["text"] for p in parts) if text_only else parts}
        if calls:
            body["tool_calls"] = calls
            body["content"] = body["content"] or None
        turns.append(body)
    return turns


def _tools(body: MessagesRequest, hosted: str = "ignore", ignored: list[str] | None = None) -> tuple[list[dict] | None, object, bool]:
    """(chat tools, chat tool_choice, parallel calls allowed) of the request's tools and tool_choice. A server tool
    (web_search_..., code_execution_...: Anthropic runs them) is left out and named in `ignored` (--hosted-tools
    ignore) or refused; so is a tool with defer_loading, which Anthropic's API keeps out of the model's context until
    a tool search loads it (Claude Code declares one)."""
    converted = []
    for index, tool in enumerate(body.tools or []):
        if not isinstance(tool, dict):
            raise APIError(400, f"tools.{index}: a tool must be an object", param="tools")
        if tool.get("type") not in (None, "custom") and hosted == "ignore" and ignored is not None:
            ignored.append(f"tools.{index} ({str(tool.get('type'))[:40]})")
            continue
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools.{index}: tools of type '{str(tool.get('type'))[:40]}' are not supported: this server runs no "
                                "server tools; declare a client tool (name, description, input_schema)", param="tools")
        if tool.get("defer_loading") is True and ignored is not None:
            ignored.append(f"tools.{index} (defer_loading)")
            continue
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    choice, parallel = body.tool_choice or {}, True
    kind = choice.get("type", "auto")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "auto":
        mapped = "auto" if converted else None
    elif kind == "any":
        mapped = "required"
    elif kind == "none":
        mapped = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        mapped = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise APIError(400, "tool_choice.type must be auto, any, tool (with a name) or none", param="tool_choice")
    return converted or None, mapped, parallel


def chat_request(body: MessagesRequest, hosted: str = "ignore", ignored: list[str] | None = None) -> ChatCompletionRequest:
    """The chat completion a Messages request means (`hosted`, `ignored`: as `_tools` reads server tools)."""
    messages = [{"role": "system", "content": _text_of(body.system, "system")}] if body.system else []
    for index, message in enumerate(body.messages):
        messages += _turn(message, index)
    tools, choice, parallel = _tools(body, hosted, ignored)
    fields: dict = {"model": body.model, "messages": messages, "max_tokens": body.max_tokens, "stop": body.stop_sequences,
                    "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "tools": tools,
                    "tool_choice": choice, "parallel_tool_calls": parallel, "stream": body.stream}
    template: dict = {}
    thinking = (body.thinking or {}).get("type")
    if thinking in THINKING:  # Qwen3's templates (and others') read enable_thinking
        template["enable_thinking"] = thinking != "disabled"
    elif thinking is not None:
        raise APIError(400, f"thinking.type must be one of {', '.join(THINKING)}", param="thinking")
    output = body.output_config or {}
    if output.get("effort") is not None:  # templates that read reasoning_effort (gpt-oss's) use it
        template["reasoning_effort"] = str(output["effort"])
    fmt = output.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}", param="output_config.format")
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    if template:
        fields["chat_template_kwargs"] = template
    return as_chat_request(fields, {"max_tokens": "max_tokens", "stop": "stop_sequences"})


__all__ = ["chat_request"]
