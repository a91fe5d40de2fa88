"""Splitting a reasoning model's thinking from its answer (`--reasoning-parser`, vLLM's names and fields).

| parser | models | what the model writes |
|---|---|---|
| qwen3 | Qwen3, QwQ | `<think>` thinking `</think>` answer; no think block: all answer |
| deepseek_r1 | DeepSeek-R1, its distills | thinking `</think>` answer (the template opened `<think>`); no `</think>` yet: all thinking |

`auto` picks from the chat template: one that writes `<think>` at the end of its generation prompt opens
the block itself (deepseek_r1), one that otherwise mentions `<think>` leaves it to the model (qwen3).
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


def _safe_end(text: str, marker: str, start: int) -> int:
    """The end of what in text[start:] surely is not the beginning of `marker`."""
    for keep in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)


PARSERS = {"qwen3": ReasoningParser("qwen3", False), "deepseek_r1": ReasoningParser("deepseek_r1", True)}


def detect(template_source: str | None) -> str | None:
    """The parser a chat template implies, or None."""
    if not template_source or START not in template_source:
        return None
    generation = template_source[template_source.rfind("add_generation_prompt"):] if "add_generation_prompt" in template_source else ""
    if START in generation and "enable_thinking" not in generation:
        return "deepseek_r1"
    return "qwen3"


def resolve(configured: str, template_source: str | None) -> ReasoningParser | None:
    if configured == "none":
        return None
    name = detect(template_source) if configured == "auto" else configured
    return PARSERS[name] if name is not None else None
