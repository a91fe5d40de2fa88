"""RequestOptions: what a front-end (ortinf/tasks/) asks of the engine for one request, beside the client's
SamplingParams. SamplingParams holds what a client asked for and nothing else; these are the engine's
own output and rule options, set by the tasks that drive it (never read from an HTTP body):

- `output_kind`: what each output holds (vLLM's RequestOutputKind): "cumulative", everything so far;
  "delta", only what is new since the request's previous output (the server's: no O(n) copy per step);
  "final_only", one output when it finishes (LLM.generate's).
- `top_candidates`: k > 0 makes a one-step request: it computes its tokens, returns the k best next
  tokens with their log-probabilities under its rules (RequestOutput.candidates), ends, and leaves its
  last, partial block in the prefix cache for the request that continues it (a beam search's step,
  ortinf/tasks/beams.py).
- `watch_token_ids`: the model's log-probabilities of these tokens at the sampled position, before any
  rule (RequestOutput.watched): Whisper's no-speech probability.
- `whisper_timestamps`: None, no speech rules; False, the package's Whisper rules (suppressed and
  begin-suppressed tokens) as transformers' generate applies them, before the scores it reports; True,
  those and the timestamp rules (ortinf/runtime/sample/whisper_rules.py). Request data choosing the
  package's batch rules, never functions.
- `bad_words_ids`: the client's bad_words as token sequences (the engine's tokenizer fills them in).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortinf.errors import RequestError

OUTPUT_KINDS = ("cumulative", "delta", "final_only")


@dataclass(frozen=True, slots=True)
class RequestOptions:
    output_kind: str = "cumulative"
    top_candidates: int = 0
    watch_token_ids: tuple[int, ...] = ()
    whisper_timestamps: bool | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.output_kind not in OUTPUT_KINDS:
            raise RequestError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {self.output_kind!r}", param="output_kind")
        if isinstance(self.top_candidates, bool) or not isinstance(self.top_candidates, int) or self.top_candidates < 0:
            raise RequestError("top_candidates must be a non-negative integer", param="top_candidates")
        object.__setattr__(self, "watch_token_ids", tuple(int(t) for t in self.watch_token_ids))
        object.__setattr__(self, "bad_words_ids", tuple(tuple(int(t) for t in word) for word in self.bad_words_ids))


DEFAULT = RequestOptions()

__all__ = ["DEFAULT", "OUTPUT_KINDS", "RequestOptions"]
