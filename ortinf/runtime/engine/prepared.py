"""PreparedRequest: what the engine takes in, beside outputs.py (what it gives back). Its own module, so that
the front-ends that build or pass one (tasks/, serve/) import this data class and not the engine."""

from __future__ import annotations

from dataclasses import dataclass

from ortinf.runtime.sample.request_options import DEFAULT, RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A tokenised, validated request, ready for add_request (ortinf/runtime/engine/input_processor.py makes it)."""

    text: str | None
    token_ids: list[int]
    params: SamplingParams
    lora_name: str | None = None  # a loaded LoRA adapter, None for the base model
    encoder_input: EncoderInput | None = None  # an encoder-decoder's (the source; `token_ids` are the decoder's)
    priority: int = 0  # lower runs first under the priority scheduling policy (vLLM's)
    cache_salt: str | None = None  # a client's prefix-cache salt: blocks are shared only under the same salt
    output_token_ids: tuple[int, ...] = ()  # tokens already generated (a beam's, ortinf/tasks/beams.py): computed as the prompt is
    images: tuple[PlacedImage, ...] = ()  # a vision-language request's images and where their placeholders are
    options: RequestOptions = DEFAULT  # what the front-end asks of the engine beside the client's params

    @property
    def num_prompt_tokens(self) -> int:
        """What usage counts as the prompt: the source's tokens for an encoder-decoder, else the prompt's."""
        return self.encoder_input.num_positions if self.encoder_input is not None else len(self.token_ids)
