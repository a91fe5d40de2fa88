"""POST /tokenize and /detokenize (vLLM's shapes): text or a chat conversation to token ids, and back."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.serve.admission import prepare_off_loop
from ortinf.serve.api.openai import schemas
from ortinf.serve.errors import APIError
from ortinf.serve.generation import render_prompt
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import STRICT, ChatMessage, TokenId, Tool
from ortinf.serve.state import ServerState
from ortinf.tasks.chat.tools import ToolPlan
from ortinf.tasks.text import samples
from ortinf.tokenizer import check_unicode

router = APIRouter()


class TokenizeRequest(BaseModel):
    """vLLM's two shapes in one model: a `prompt`, or chat `messages` rendered through the template."""

    model_config = STRICT

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = Field(True, description="prompt only (a chat template writes its own special tokens)")
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False

    def template_kwargs(self) -> dict | None:
        return self.chat_template_kwargs


CHAT_ONLY = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")


class DetokenizeRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    tokens: list[TokenId]


def _tokenizer(model: ServedModel):
    if model.tokenizer is None:
        raise APIError(400, f"model '{model.name}' has no tokenizer", param="model")
    return model.tokenizer


def _max_model_len(model: ServedModel) -> int:
    return (model.manifest.decoder or model.manifest.encoder).max_model_len


@router.post("/tokenize", response_model=schemas.TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request):
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "pass exactly one of prompt and messages", param="prompt")
    if body.prompt is not None:
        given = next((name for name in CHAT_ONLY if name in body.model_fields_set), None)
        if given is not None:
            raise APIError(400, f"{given} applies to messages, not to a prompt", param=given)
    elif "add_special_tokens" in body.model_fields_set:
        raise APIError(400, "add_special_tokens applies to a prompt: a chat template writes its own special tokens",
                       param="add_special_tokens")
    state: ServerState = request.app.state.ortinf
    model = await state.model(body.model, request)
    tokenizer = _tokenizer(model)

    def run() -> list[int]:
        if body.messages is not None:
            tools = ToolPlan([t.model_dump(exclude_none=True) for t in body.tools], "none") if body.tools else None
            ids = render_prompt(model, body, tools)  # type: ignore[arg-type] - it reads the chat fields only
            if model.image_placeholder is not None:  # each image's placeholder counts as the tokens it becomes (its size's)
                images = model.chat.images(body.messages, state.config.media_policy)
                ids = list(samples(model.require_engine(), ids, SamplingParams(), images=images)[0].token_ids) if images else ids
            return ids
        return tokenizer.encode(check_unicode(body.prompt, "prompt"), add_special_tokens=body.add_special_tokens).ids

    images = body.messages is not None and model.has_images(body.messages)
    ids = await prepare_off_loop(state.admission, run, images, 1)
    strs = [tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None
    return schemas.TokenizeResponse(count=len(ids), max_model_len=_max_model_len(model), tokens=ids, token_strs=strs)


@router.post("/detokenize", response_model=schemas.DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    model = await state.model(body.model, request)
    tokenizer = _tokenizer(model)
    vocab = (model.manifest.decoder or model.manifest.encoder).vocab_size
    bad = next((t for t in body.tokens if vocab is not None and t >= vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is out of range: token ids must be in [0, {vocab})", param="tokens")
    return schemas.DetokenizeResponse(prompt=tokenizer.decode(body.tokens, skip_special_tokens=False))
