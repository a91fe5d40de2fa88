"""Ollama's API (https://github.com/ollama/ollama/blob/main/docs/api.md) on the same server: /api/chat, /api/generate,
/api/embed and /api/embeddings as front-ends over the chat, completion and pooling paths; /api/tags, /api/show,
/api/ps and /api/version describe what is served. Streams are NDJSON (one JSON object a line, `done` on the last);
errors are `{"error": "..."}` (ortinf/serve/errors.py). What Ollama manages itself (pulling, creating, copying and
deleting models) is a 400 that says what to do instead: ortinf serves packages made by `ortinf export`.

Sampling defaults are the package's, as on the OpenAI routes (Ollama's come from a Modelfile): `options` set them.
As Ollama does, bodies are read as JSON whatever their Content-Type says (curl -d sends form-urlencoded, litellm's
ollama providers none), num_predict stops at the context's end instead of failing, and HEAD / answers 200 (the Go
client's heartbeat).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

import ortinf
from ortinf.manifest import FEATURE_EXTRACTION
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.serve import field_policy
from ortinf.serve.admission import AdmittedStream, prepare_off_loop, sequences
from ortinf.serve.api.ollama.protocol import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateFields,
    GenerateRequest,
    ModelRequest,
    Options,
    chat_messages,
    chat_request,
    keep_alive_seconds,
)
from ortinf.serve.encoding import embed
from ortinf.serve.errors import APIError, from_exception
from ortinf.serve.generation import Reply, chat_params, prepare_samples, render_prompt, tool_plan
from ortinf.serve.logprobs import chat_logprobs
from ortinf.serve.model_manager import load_wait
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import ChatCompletionRequest, CompletionRequest
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import final_outputs, merged, until_disconnected
from ortinf.tasks.chat.tools import ToolPlan
from ortinf.tasks.kinds import TextTask


class JSONBodies(APIRoute):
    """Ollama reads every request body as JSON whatever its Content-Type says: curl -d (its documentation's examples)
    sends application/x-www-form-urlencoded, litellm's ollama/ and ollama_chat/ providers send none. So do these
    routes: a body that is not JSON is still a 400 (`{"error": ...}`: the request body is not valid JSON)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        if self.body_field is None:  # a route that reads no body (the refused model management ones)
            return handler

        async def handle(request: Request) -> Response:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if request.method == "POST" and not (kind == "application/json" or kind.endswith("+json")):
                headers = [(name, value) for name, value in request.scope["headers"] if name != b"content-type"]
                request = Request({**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}, request.receive)
            if request.method == "POST" and not (await request.body()).lstrip().startswith(b"{"):  # read once: the handler reuses it
                raise APIError(400, "the request body must be a JSON object" if await request.body() else "missing request body")
            return await handler(request)

        return handle


router = APIRouter(route_class=JSONBodies)
# The Ollama API whose behaviour these routes implement (clients gate features on it: Codex's --oss ollama provider
# wants >= 0.13.4); ortinf's own version is beside it. Ollama 0.13.5's API as ortinf has it: /api/chat and /api/generate
# with tools, thinking (think), format schemas, logprobs and top_logprobs (0.12 on), images, keep_alive; /api/embed;
# HEAD / as the heartbeat; and on the same port the OpenAI routes, /v1/responses among them (what Codex speaks once
# the version passes). Model management (pull, create, ...) is a 400 that says what to do instead.
API_VERSION = "0.13.5"
FOREVER = "2318-01-01T00:00:00Z"  # expires_at of a model that stays loaded (Ollama's keep_alive -1)


async def _served(state: ServerState, name: str | None, request: Request, keep_alive: float | str | None = None) -> ServedModel:
    """The model by its Ollama name: a served name, or one with Ollama's default tag (`:latest`); a request's keep_alive
    says how long a --models-dir model stays loaded once idle after it."""
    seconds = keep_alive_seconds(keep_alive) if keep_alive is not None else None
    known = set(state.registry.names) | (set(state.models.catalog) if state.models is not None else set())
    if name is not None and name not in known and name.endswith(":latest"):
        name = name.removesuffix(":latest")
    model = await state.model(name, request)
    if seconds is not None and state.models is not None:
        state.models.keep_alive(model.parent or model.name, seconds)
    return model


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ignored(route: str, body: BaseModel) -> list[str]:
    ignored = field_policy.apply(route, body)
    options = getattr(body, "options", None)
    extra = options.model_extra if isinstance(options, Options) else (options or {}) if isinstance(options, dict) else {}
    return ignored + [f"options.{name}" for name in extra]


def _ndjson(line: dict) -> str:
    return json.dumps(line, ensure_ascii=False) + "\n"


def _timings(start: float, output: RequestOutput, prompt_tokens: int, load: float) -> dict:
    """Ollama's counts and durations (nanoseconds): the model's load if the request waited for it (`load` seconds,
    ModelManager.use), the prompt's evaluation until the first token, then the output's."""
    metrics = output.metrics
    now = time.monotonic()
    first = metrics.first_token_time if metrics is not None and metrics.first_token_time is not None else now
    arrival = metrics.arrival_time if metrics is not None else start
    return {"total_duration": int((now - start + load) * 1e9), "load_duration": int(load * 1e9), "prompt_eval_count": prompt_tokens,
            "prompt_eval_duration": int(max(first - arrival, 0) * 1e9), "eval_count": output.num_output_tokens,
            "eval_duration": int(max(now - first, 0) * 1e9)}


def _ended(line: dict, output: RequestOutput, start: float, prepared: list, request: Request) -> dict:
    """The last line: why it ended ("length" at num_predict or the context, else "stop"), its counts and durations."""
    reason = "length" if output.outputs[0].finish_reason == "length" else "stop"
    return {**line, "done": True, "done_reason": reason, **_timings(start, output, prepared[0].num_prompt_tokens, load_wait(request))}


def _loaded_answer(model: ServedModel, request: Request, body: dict) -> JSONResponse:
    """Ollama's answer to a request with nothing to say (its way to load a model): done at once, with the load's time."""
    load = int(load_wait(request) * 1e9)
    return JSONResponse({"model": model.name, "created_at": _now(), **body, "done_reason": "load", "done": True,
                         "total_duration": load, "load_duration": load})


def _calls(reply: Reply) -> list[dict]:
    found = []
    for call in reply.calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments else {}
        except ValueError:
            arguments = {}
        found.append({"function": {"name": call.name, "arguments": arguments if isinstance(arguments, dict) else {"value": arguments}}})
    return found


def _clipped(prepared: list, limit: int | None) -> list:
    """num_predict as Ollama has it: at most `limit` tokens, and never past the context's end (prepared without a
    limit, each request's max_tokens is what its context leaves; a prompt alone past it was a 400 there)."""
    if limit is None:
        return prepared
    return [replace(p, params=replace(p.params, max_tokens=min(p.params.max_tokens, limit))) for p in prepared]



Frame = Callable[..., dict]  # (thinking, text, calls, logprobs) -> a line's body, done aside


async def _run(request: Request, state: ServerState, model: ServedModel, prepared: list, tools: ToolPlan, frame: Frame,
               headers: dict[str, str], logprobs: bool):
    """Runs the prepared request; `frame(thinking, text, calls, logprobs)` shapes a line's body. Streamed as NDJSON (the
    text and calls in lines before the last, which is done with empty text, as Ollama's), or one object."""
    start = time.monotonic()
    request_id = f"ollama-{hashlib.sha1(str(start).encode()).hexdigest()[:12]}"
    ticket = state.admission.acquire(sequences(prepared))
    if prepared[0].options.output_kind != "delta":  # not streamed: one final output
        try:
            (output,) = await until_disconnected(request, final_outputs(model.require_engine(), prepared, request_id))
        finally:
            ticket.release()
        reply, completion = Reply(model, tools), output.outputs[0]
        thinking, text = reply.feed(completion.text, True, completion.finish_reason == "length")
        entries = chat_logprobs(model, completion.logprobs or [])["content"] if logprobs else None
        return JSONResponse(_ended(frame(thinking, text, _calls(reply), entries), output, start, prepared, request), headers=headers)

    async def lines() -> AsyncIterator[str]:
        reply = Reply(model, tools)
        samples = merged(model.require_engine(), prepared, request_id)
        pending: list = []  # logprobs of tokens whose text is not sent yet (held back as a possible tool call)
        try:
            async for _, output in samples:
                delta = output.outputs[0]
                thinking, text = reply.feed(delta.text, bool(delta.finish_reason), delta.finish_reason == "length")
                pending += (delta.logprobs or []) if logprobs else []
                calls = _calls(reply) if delta.finish_reason else []
                if thinking or text or calls or (delta.finish_reason and pending):
                    entries = chat_logprobs(model, pending)["content"] if logprobs else None
                    yield _ndjson({**frame(thinking, text, calls, entries), "done": False})
                    pending = []
                if delta.finish_reason:
                    yield _ndjson(_ended(frame("", "", [], None), output, start, prepared, request))
        except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
            yield _ndjson({"error": from_exception(exc).message})
        finally:
            await samples.aclose()  # type: ignore[attr-defined] - aborts the request if the client went away

    stream = AdmittedStream(lines(), ticket)
    stream.media_type = "application/x-ndjson"
    stream.headers["content-type"] = "application/x-ndjson"
    stream.headers.update(headers)
    return stream


async def _chat_prepared(state: ServerState, model: ServedModel, chat: ChatCompletionRequest, body: GenerateFields) -> tuple[ToolPlan, list]:
    tools = tool_plan(model, chat, state.config.default_tool_choice)
    params = chat_params(model, chat, tools, body.logprobs_count())

    def prepare() -> list:  # rendering, tokenising and decoding images are CPU work: off the event loop
        images = model.images(chat.messages, state.config.media_policy)
        prepared = prepare_samples(model, [render_prompt(model, chat, tools)], params, 1, body.stream, images=images, cache_salt=chat.cache_salt)
        return _clipped(prepared, body.options.max_tokens() if body.options else None)

    return tools, await prepare_off_loop(state.admission, prepare, model.has_images(chat.messages), 1)


def _line(model: ServedModel, logprobs: list | None, **fields: Any) -> dict:
    line = {"model": model.name, "created_at": _now(), **fields}
    return {**line, "logprobs": logprobs} if logprobs else line


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = _ignored("/api/chat", body)
    model = await _served(state, body.model, request, body.keep_alive)
    model.require_engine()
    if not body.messages:  # Ollama's way to load a model: nothing to say, done at once
        return _loaded_answer(model, request, {"message": {"role": "assistant", "content": ""}})
    chat_body = chat_request(body, chat_messages(body.messages), body.tools)
    tools, prepared = await _chat_prepared(state, model, chat_body, body)

    def frame(thinking: str, text: str, calls: list, logprobs: list | None) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return _line(model, logprobs, message=message)

    return await _run(request, state, model, prepared, tools, frame, field_policy.response_headers(ignored, tools.warning), body.logprobs)


def _completion(body: GenerateRequest) -> CompletionRequest:
    """A raw prompt's completion request; its fields' errors a 400 worded as on the templated path (as_chat_request)."""
    fields = {"model": body.model, "prompt": body.prompt, "cache_salt": body.salt(), **(body.options.sampling() if body.options else {})}
    try:
        return CompletionRequest.model_validate({**{key: value for key, value in fields.items() if value is not None}, "max_tokens": None})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        raise APIError(400, f"{where}: {error.get('msg', 'invalid value')}", param=where or None) from None


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = _ignored("/api/generate", body)
    model = await _served(state, body.model, request, body.keep_alive)
    model.require_engine()
    if not body.prompt and not body.images:  # Ollama's way to load a model
        return _loaded_answer(model, request, {"response": ""})
    if body.raw or model.chat_template is None:  # the prompt as it is: a completion
        if body.images:
            raise APIError(400, "images need the model's chat template: send them without raw", param="images")
        completion = _completion(body)
        params = completion.sampling_params(None, body.logprobs_count())
        tools = ToolPlan(None, "none")
        limit = body.options.max_tokens() if body.options else None

        def prepare() -> list:
            return _clipped(prepare_samples(model, [body.prompt], params, 1, body.stream, cache_salt=completion.cache_salt), limit)

        prepared = await prepare_off_loop(state.admission, prepare, False, 1)
    else:
        user: dict[str, Any] = {"role": "user", "content": body.prompt or ""}
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + chat_messages([{**user, "images": body.images}])
        tools, prepared = await _chat_prepared(state, model, chat_request(body, messages), body)

    def frame(thinking: str, text: str, calls: list, logprobs: list | None) -> dict:
        line = _line(model, logprobs, response=text)
        return {**line, "thinking": thinking} if thinking else line

    return await _run(request, state, model, prepared, tools, frame, field_policy.response_headers(ignored, tools.warning), body.logprobs)


@router.post("/api/embed")
async def embed_route(body: EmbedRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = _ignored("/api/embed", body)
    model = await _served(state, body.model, request, body.keep_alive)
    start = time.monotonic()
    items = [body.input] if isinstance(body.input, str) else body.input
    limit = model.manifest.encoder.max_model_len if body.truncate and model.manifest.encoder is not None else None
    vectors, tokens = await embed(request, state, model, items, limit, body.dimensions)
    load = load_wait(request)
    return JSONResponse({"model": model.name, "embeddings": vectors.tolist(), "total_duration": int((time.monotonic() - start + load) * 1e9),
                         "load_duration": int(load * 1e9), "prompt_eval_count": tokens}, headers=field_policy.ignored_headers(ignored))


@router.post("/api/embeddings")
async def embeddings_route(body: EmbeddingsRequest, request: Request):
    """The older embedding route: one prompt, one `embedding`."""
    state: ServerState = request.app.state.ortinf
    ignored = _ignored("/api/embeddings", body)
    model = await _served(state, body.model, request, body.keep_alive)
    vectors, _ = await embed(request, state, model, [body.prompt], None, None)
    return JSONResponse({"embedding": vectors[0].tolist()}, headers=field_policy.ignored_headers(ignored))


def _size(package: Path) -> int:
    return sum(path.stat().st_size for path in package.rglob("*") if path.is_file())


def _details(model: ServedModel) -> dict:
    manifest = model.manifest
    return {"parent_model": model.parent or "", "format": "onnx", "family": manifest.model_type, "families": [manifest.model_type],
            "parameter_size": "", "quantization_level": manifest.dtype}


def _card(model: ServedModel) -> dict:
    manifest_path = model.package_dir / "ortinf.json"
    digest = hashlib.sha256(manifest_path.read_bytes()).hexdigest() if manifest_path.is_file() else ""
    modified = datetime.fromtimestamp(manifest_path.stat().st_mtime if manifest_path.is_file() else model.created, timezone.utc)
    return {"name": model.name, "model": model.name, "modified_at": modified.isoformat().replace("+00:00", "Z"),
            "size": _size(model.package_dir), "digest": digest, "details": _details(model)}


def _context_length(model: ServedModel) -> int:
    return model.task.max_model_len


def _entry_card(entry) -> dict:  # a model_manager.Entry not loaded now
    """An unloaded --models-dir model as /api/tags lists it: its facts as surveyed (models_folder.py: no disk access
    here), `error` on one that cannot be served."""
    facts = entry.read()
    details = {"parent_model": "", "format": "onnx" if entry.kind == "package" else entry.kind, "family": facts.model_type,
               "families": [], "parameter_size": "", "quantization_level": facts.dtype}
    modified = datetime.fromtimestamp(facts.modified, timezone.utc).isoformat().replace("+00:00", "Z")
    card = {"name": entry.name, "model": entry.name, "modified_at": modified, "size": facts.size, "digest": facts.digest, "details": details}
    return {**card, "error": facts.error} if facts.error is not None else card


@router.get("/api/tags")
async def tags(request: Request):
    """Every model this server can serve: loaded ones, and with --models-dir the ones that load on request."""
    state: ServerState = request.app.state.ortinf
    models = [_card(m) for m in (*state.registry.models.values(), *state.registry.adapters())]
    if state.models is not None:
        models += [_entry_card(entry) for entry in await state.models.listed()]
    return {"models": sorted(models, key=lambda m: m["name"])}


def _expires(state: ServerState, name: str) -> str:
    """When the model unloads once idle; FOREVER when it stays, or when no date can say when (keep_alive is bounded
    where it is read, ollama_protocol.keep_alive_seconds, and /api/ps answers every client: it must not fail)."""
    at = state.models.expires(name) if state.models is not None else None
    try:
        return FOREVER if at is None else datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return FOREVER


@router.get("/api/ps")
async def ps(request: Request):
    """The loaded models, with when each unloads if it stays idle (far ahead: it stays)."""
    state: ServerState = request.app.state.ortinf
    models = [*state.registry.models.values(), *state.registry.adapters()]
    return {"models": [{**_card(m), "expires_at": _expires(state, m.parent or m.name), "size_vram": 0, "context_length": _context_length(m),
                        "load_duration": int(m.load_seconds * 1e9)}  # ortinf's: how long the model took to load
                       for m in models]}


@router.post("/api/show")
async def show(body: ModelRequest, request: Request):
    """A model's description; a --models-dir model is described from its package, not loaded for it."""
    state: ServerState = request.app.state.ortinf
    field_policy.apply("/api/show", body)
    name = body.model or body.name
    bare = name.removesuffix(":latest") if name is not None else None
    entry = next((e for e in await state.models.listed() if e.name == bare), None) if state.models is not None else None
    if entry is not None:
        card = _entry_card(entry)
        task = entry.read().task
        return {"license": "", "modelfile": f"FROM {entry.source}\n", "parameters": "", "template": "", "details": card["details"],
                "model_info": {"ortinf.task": task, "ortinf.loaded": False, **({"ortinf.error": card["error"]} if "error" in card else {})},
                "capabilities": ["embedding"] if task == FEATURE_EXTRACTION else ["completion"], "modified_at": card["modified_at"]}
    model = await _served(state, name, request)
    manifest = model.manifest
    capabilities = ["embedding"] if manifest.task == FEATURE_EXTRACTION else []
    if isinstance(model.task, TextTask):
        capabilities.append("completion")
        capabilities += ["tools"] if model.tool_parser is not None else []
        capabilities += ["thinking"] if model.reasoning_parser is not None else []
        capabilities += ["vision"] if manifest.vision is not None else []
    info = {"general.architecture": manifest.model_type, "general.basename": manifest.architecture,
            f"{manifest.model_type}.context_length": _context_length(model), "ortinf.task": manifest.task, "ortinf.dtype": manifest.dtype}
    template = model.chat_template.source if model.chat_template is not None else ""
    card = _card(model)
    return {"license": "", "modelfile": f"# ortinf package {model.package_dir.name}\nFROM {model.package_dir}\n", "parameters": "",
            "template": template, "details": card["details"], "model_info": info, "capabilities": capabilities,
            "modified_at": card["modified_at"]}


@router.get("/api/version")
async def version():
    return {"version": API_VERSION, "ortinf": ortinf.__version__}


# Ollama answers HEAD on these as on GET (a client checks a server is there before it asks)
router.add_api_route("/api/tags", tags, methods=["HEAD"], include_in_schema=False)
router.add_api_route("/api/version", version, methods=["HEAD"], include_in_schema=False)


@router.head("/", include_in_schema=False)
async def heartbeat():
    """Ollama's Go client's heartbeat (api.Client.Heartbeat: HEAD /, 200). GET / is the chat page; both are open
    with --api-key (app.OPEN_PATHS), as Ollama, which has no key, answers them."""
    return Response(status_code=200)


MANAGED = {"/api/pull": "pull", "/api/push": "push", "/api/create": "create", "/api/copy": "copy", "/api/delete": "delete"}


def _managed(action: str):
    async def refuse():
        raise APIError(400, f"ortinf does not {action} models: it serves packages made by `ortinf export <hf-folder or gguf> -o DIR` "
                            "(`ortinf serve DIR ...`)")
    return refuse


for _path, _action in MANAGED.items():
    router.add_api_route(_path, _managed(_action), methods=["DELETE"] if _action == "delete" else ["POST"], include_in_schema=False)
router.add_api_route("/api/blobs/{digest}", _managed("upload blobs for"), methods=["POST", "HEAD"], include_in_schema=False)


__all__ = ["router"]
