"""Incremental detokenisation and stop strings.

Text comes from `tokenizers`' own DecodeStream where the installed tokenizers has it (0.21+; Rust,
one call per token), seeded with the prompt's last tokens so that the first output token decodes in
context. DecodeStream refuses some byte-fallback sequences (a lone UTF-8 continuation byte, then a
piece: "Invalid prefix encountered"); a request that meets one goes on with the window method, from the
token that failed, instead of failing. Elsewhere, text is decoded from a short window of tokens so that multi-byte characters split
across tokens and leading-space rules come out right: a delta is emitted only once the window
decodes to more text than its prefix did, and never while it ends in an incomplete character (U+FFFD).

Stop strings: while a request runs, the last (longest stop string - 1) characters are held back,
so a stop string split across tokens never reaches the client; when one is found the text ends
just before it (or after it, with include_stop_str_in_output).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

from ortinf.runtime.sample.sampling_params import SamplingParams

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # tokenizers < 0.21
    DecodeStream = None

PROMPT_CONTEXT = 6  # prompt tokens kept in the window so the first output token decodes in context


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, a token at a time."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stop = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.hold_back = max((len(s) for s in self.stop), default=1) - 1
        self.ids = list(prompt_token_ids[-PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all decoded output text (up to a stop string, once found)
        self.stopped_by: str | None = None
        self.stream = None
        if DecodeStream is not None:
            try:
                self.stream = DecodeStream(ids=self.ids, skip_special_tokens=self.skip_special_tokens)
            except TypeError:  # a DecodeStream without prompt context (0.21): the window method keeps the context
                self.stream = None

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def add_tokens(self, token_ids: Sequence[int]) -> str | None:
        """Appends tokens; returns the stop string if one now appears in the text (then the text ends
        there, and no more tokens are to come: ortinf/runtime/core/stopping.py feeds one token at a time)."""
        for token_id in token_ids:
            if self.stream is not None:
                try:
                    chunk = self.stream.step(self.tokenizer, token_id)
                except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception for an invalid prefix
                    # the window method from here on: the text so far stands, the last tokens are its context
                    self.stream = None
                    self.prefix_offset, self.read_offset = max(0, len(self.ids) - PROMPT_CONTEXT), len(self.ids)
                else:
                    self.ids.append(token_id)  # kept for a fallback
                    if chunk:
                        before = len(self.text)
                        self.text += chunk
                        if self.stop and self._find_stop(before):
                            return self.stopped_by
                    continue
            self.ids.append(token_id)
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
            full = self._decode(self.ids[self.prefix_offset :])
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                before = len(self.text)
                self.text += full[len(prefix) :]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
                if self.stop and self._find_stop(before):
                    return self.stopped_by
        return None

    def _find_stop(self, before: int) -> bool:
        search_from = max(0, before - self.hold_back)
        hits = [(self.text.find(s, search_from), s) for s in self.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if not hits:
            return False
        index, stop = min(hits)
        self.text = self.text[: index + len(stop)] if self.include_stop else self.text[:index]
        self.stopped_by = stop
        return True

    def visible_text(self, finished: bool) -> str:
        """The text a client may see now: all of it once finished, else minus the held-back tail."""
        return self.text[: self.visible_length(finished)]

    def visible_length(self, finished: bool) -> int:
        if finished or not self.stop or self.stopped_by is not None:
            return len(self.text)
        return max(0, len(self.text) - self.hold_back)
