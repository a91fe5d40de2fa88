"""Loading and unloading LoRA adapters at runtime (vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter), mounted only with `ortinf serve --allow-runtime-lora-updates`: a client
that may call them may make the server read any adapter folder it can name."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import STRICT
from ortinf.serve.state import ServerState
from ortinf.tasks.kinds import TextTask

router = APIRouter()


class LoadLoraAdapter(BaseModel):
    model_config = STRICT
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraAdapter(BaseModel):
    model_config = STRICT
    lora_name: str = Field(min_length=1, max_length=256)


def lora_base(state: ServerState) -> ServedModel:
    """The generation model that serves adapters (the one whose engine has LoRA slots)."""
    for model in state.registry.models.values():
        if isinstance(model.task, TextTask) and model.task.serves_loras:
            return model
    raise APIError(400, "no model here serves LoRA adapters: start the server with --max-loras (or --lora-modules) on a "
                        "package exported with --enable-lora")


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapter, request: Request):
    state: ServerState = request.app.state.ortinf
    if body.lora_name in state.registry.loras or body.lora_name in state.registry.models:
        raise APIError(400, f"the name '{body.lora_name}' is already served: unload it first, or choose another", param="lora_name")
    base = lora_base(state)
    engine = base.require_engine()
    # the file is read and checked here, off the engine thread; the engine thread only writes the slot
    adapter = await asyncio.to_thread(base.task.read_lora, body.lora_name, body.lora_path)
    await engine.call(lambda e: e.add_lora(body.lora_name, adapter))
    state.registry.add_lora(body.lora_name, base.name)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapter, request: Request):
    state: ServerState = request.app.state.ortinf
    base_name = state.registry.loras.get(body.lora_name)
    if base_name is None:
        raise APIError(404, f"no LoRA adapter named '{body.lora_name}' is loaded", param="lora_name", code="model_not_found")
    await state.registry.models[base_name].require_engine().call(lambda engine: engine.remove_lora(body.lora_name))
    del state.registry.loras[body.lora_name]
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
