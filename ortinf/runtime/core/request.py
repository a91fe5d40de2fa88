"""Request: one sequence's state in the engine, owned by the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ortinf.runtime.sample.request_options import DEFAULT, RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request ended; the values are OpenAI's finish_reason strings."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"


@dataclass(slots=True)
class Request:
    """A prompt plus what has been generated; `num_computed_tokens` of its tokens are in the KV pool.

        all_token_ids:  | prompt (num_prompt_tokens) | output_token_ids |
                        |<-- num_computed_tokens -->| still to compute (catch up within budget)
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first scheduling
    num_preemptions: int = 0
    num_prefill_chunks: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    block_hashes: list[int] = field(default_factory=list)
    lora_slot: int = -1  # its LoRA adapter's slot (ortinf/runtime/worker/lora.py), -1 for the base model
    lora_key: str | None = None  # the adapter's identity in prefix-cache keys (a new one per load)
    encoder_input: EncoderInput | None = None  # an encoder-decoder's (ortinf/runtime/worker/encoder_input.py)
    priority: int = 0  # lower runs first under the priority scheduling policy
    salt: str | None = None  # the client's cache_salt (vLLM's)
    images: tuple[PlacedImage, ...] = ()  # a vision-language request's images, where their placeholders are
    options: RequestOptions = DEFAULT  # what its front-end asks of the engine (output kind, candidates, rules)
    disk_keys: list[str] = field(default_factory=list)  # its full blocks' keys in the prefix store (memoised, as block_hashes)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def cache_salt(self) -> str | None:
        """What the request's K/V depend on besides its tokens (its LoRA adapter, its encoder input) and
        whom it may share them with (the client's salt): the root of its prefix-cache keys, so that
        blocks computed under another salt never match."""
        images = ",".join(p.image.digest for p in self.images) or None
        parts = [part for part in (self.lora_key, self.encoder_input.digest if self.encoder_input is not None else None, images,
                                   None if self.salt is None else f"salt:{self.salt}") if part is not None]
        return "|".join(parts) if parts else None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
