"""DecoderRules: what an encoder-decoder package's generation config asks of every decoding, as
transformers' generate applies it at num_beams=1 (its logits processors), for the model runner's sampler:

- `suppress_tokens` and one-token `bad_words_ids` (Marian: the pad token) are never sampled;
- `begin_suppress_tokens` are not sampled as the first output token;
- `forced_bos_token_id` is the first output token, `forced_eos_token_id` the last one the length allows.

Text decoders have none of these (their packages carry no such config): the engine builds rules only
for encoder-decoder packages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DecoderRules:
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    forced_bos: int | None = None
    forced_eos: int | None = None

    @classmethod
    def load(cls, package_dir: str | Path, vocab_size: int) -> DecoderRules:
        """From the package's generation_config.json (ids past the vocabulary ignored)."""
        path = Path(package_dir) / "generation_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        banned = [w[0] for w in config.get("bad_words_ids") or [] if len(w) == 1]
        return cls(tuple(t for t in (config.get("suppress_tokens") or []) + banned if t < vocab_size),
                   tuple(t for t in config.get("begin_suppress_tokens") or [] if t < vocab_size),
                   config.get("forced_bos_token_id"), config.get("forced_eos_token_id"))

    def banned(self, num_output_tokens: int) -> tuple[int, ...]:
        """The tokens the next sample may not be."""
        return self.suppress + self.begin_suppress if num_output_tokens == 0 else self.suppress

    def forced(self, num_output_tokens: int, max_tokens: int | None) -> int | None:
        """The token the next sample must be, if any: forced BOS first, forced EOS last."""
        if num_output_tokens == 0:
            return self.forced_bos
        if max_tokens is not None and num_output_tokens + 1 >= max_tokens:
            return self.forced_eos
        return None


__all__ = ["DecoderRules"]
