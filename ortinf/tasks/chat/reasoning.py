"""Splitting a reasoning model's thinking from its answer (`--reasoning-parser`, vLLM's names and fields).

| parser | models | what the model writes |
|---|---|---|
| qwen3 | Qwen3, QwQ | `<think>` thinking `</think>` answer; no think block: all answer |
| deepseek_r1 | DeepSeek-R1, its distills | thinking `</think>` answer (the template opened `<think>`); no `</think>` yet: all thinking |
| gpt_oss | gpt-oss (harmony) | `<|channel|>analysis<|message|>` thinking `<|end|>...<|channel|>final<|message|>` answer |

`auto` picks from the chat template: one that writes `<think>` at the end of its generation prompt opens
the block itself (deepseek_r1), one that otherwise mentions `<think>` leaves it to the model (qwen3), one
that writes harmony's `<|channel|>` is gpt-oss's. Harmony's markers are special tokens, so its requests keep
special tokens in the text (`keeps_special_tokens`, as the tool-call parsers whose markers are).
The thinking goes to `message.reasoning_content` (streamed as `delta.reasoning_content`) and to a
reasoning item in the Responses API; the answer is the content, which the tool-call parser then reads.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    name: str
    opened_by_prompt: bool  # the template writes START: the output begins inside the block
    keeps_special_tokens: bool = False

    def split(self, text: str, finished: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of the output so far, None where there is none. Unfinished, only what is
        settled: text that may still become a marker is held back, so both only ever grow."""
        head = text.lstrip()
        if head.startswith(START):
            begin = len(text) - len(head) + len(START)
        elif not finished and START.startswith(head):
            return None, None  # nothing yet, or the beginning of START
        elif self.opened_by_prompt:
            begin = 0
        else:
            return None, text  # no thinking: all answer
        end = text.find(END, begin)  # leading newlines are the markers' layout, not text (lstrip keeps both growing only)
        if end < 0:  # still thinking (finished so: a model cut short, or one that never closed the block)
            return (text[begin:] if finished else text[begin:_safe_end(text, END, begin)]).lstrip("\n"), None
        return text[begin:end].lstrip("\n"), text[end + len(END):].lstrip("\n")


ANALYSIS, FINAL = "<|channel|>analysis<|message|>", "<|channel|>final<|message|>"
HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")


@dataclass(frozen=True, slots=True)
class HarmonyParser:
    """gpt-oss: the analysis channel is the thinking, the final channel the answer; the `<|end|><|start|>assistant`
    between them and a closing `<|return|>` are neither."""

    name: str = "gpt_oss"
    keeps_special_tokens: bool = True

    def split(self, text: str, finished: bool = True) -> tuple[str | None, str | None]:
        final = text.find(FINAL)
        if final >= 0:
            return self._thinking(text[:final], True), _strip_end(text[final + len(FINAL):], finished)
        if not text.startswith(ANALYSIS):
            if not finished and (ANALYSIS.startswith(text) or FINAL.startswith(text)):
                return None, None  # the beginning of a channel header
            return None, text  # no channel header: all answer
        return self._thinking(text, finished), None

    @staticmethod
    def _thinking(text: str, finished: bool) -> str | None:
        if not text.startswith(ANALYSIS):
            return None
        body = text[len(ANALYSIS):]
        end = body.find("<|end|>")
        if end >= 0:
            return body[:end]
        return body if finished else body[:min(_safe_end(body, marker, 0) for marker in (*HARMONY_ENDS, FINAL))]


def _strip_end(answer: str, finished: bool) -> str:
    for marker in HARMONY_ENDS:
        at = answer.find(marker)
        if at >= 0:
            return answer[:at]
    return answer if finished else answer[:min(_safe_end(answer, marker, 0) for marker in HARMONY_ENDS)]


def _safe_end(text: str, marker: str, start: int) -> int:
    """The end of what in text[start:] surely is not the beginning of `marker`."""
    for keep in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)


PARSERS: dict[str, ReasoningParser | HarmonyParser] = {"qwen3": ReasoningParser("qwen3", False),
                                                       "deepseek_r1": ReasoningParser("deepseek_r1", True), "gpt_oss": HarmonyParser()}


def detect(template_source: str | None) -> str | None:
    """The parser a chat template implies, or None."""
    if template_source and "<|channel|>" in template_source:
        return "gpt_oss"
    if not template_source or START not in template_source:
        return None
    generation = template_source[template_source.rfind("add_generation_prompt"):] if "add_generation_prompt" in template_source else ""
    if START in generation and "enable_thinking" not in generation:
        return "deepseek_r1"
    return "qwen3"


def resolve(configured: str, template_source: str | None) -> ReasoningParser | HarmonyParser | None:
    if configured == "none":
        return None
    name = detect(template_source) if configured == "auto" else configured
    return PARSERS[name] if name is not None else None
