"""Programs: request kinds above the engine, as state machines the one driver runs (ortinf/tasks/driver.py).

A program starts with prepared requests (each under a key of its own) and, each time one of them
advances (an output, or the exception that ended it), returns what to hand its caller, as (index,
output) pairs, and the requests that come next. It raises to end itself with an error. Kinds:
- Samples (here): n samples of prompts, one request each; every output is handed out as it comes.
- BeamSearches (ortinf/tasks/beams.py): one request per live beam per step; the n best at the end.
- WindowJob (ortinf/tasks/speech/transcriber.py): a Whisper job's windows, probes and retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortinf.runtime.engine.outputs import RequestOutput
    from ortinf.runtime.engine.prepared import PreparedRequest

Handed = list[tuple[Any, "RequestOutput"]]


class Program:
    """The driver's contract (see the module's docstring)."""

    blocking = False  # advance() does slow work (the async driver runs it off the event loop)
    finals: dict[int, RequestOutput]  # what it has handed out, joined, by index

    def start(self) -> list[tuple[Any, PreparedRequest]]:
        raise NotImplementedError

    def advance(self, key: Any, outcome: RequestOutput | BaseException) -> tuple[Handed, list[tuple[Any, PreparedRequest]]]:
        raise NotImplementedError

    @property
    def complete(self) -> bool:
        raise NotImplementedError

    def merged(self, request_id: str) -> RequestOutput:
        """Every sample's final output folded into one RequestOutput (completions by index), vLLM's shape."""
        indices = sorted(self.finals)
        head = self.finals[indices[0]]
        return replace(head, request_id=request_id, outputs=[replace(self.finals[i].outputs[0], index=i) for i in indices])


class Samples(Program):
    """Sampled requests (the n samples of each prompt, prompt-major), one engine request each. Every output is
    handed out as it comes, under its index; with `keep` the whole output of each is kept in `finals`
    (deltas joined) for a caller that wants them all at the end."""

    def __init__(self, prepared: Sequence[PreparedRequest], keep: bool = True) -> None:
        self.prepared = list(prepared)
        self.keep = keep
        self.finals: dict[int, RequestOutput] = {}
        self.ended = 0

    @property
    def complete(self) -> bool:
        return self.ended == len(self.prepared)

    def start(self) -> list[tuple[Any, PreparedRequest]]:
        return list(enumerate(self.prepared))

    def advance(self, key: Any, outcome: RequestOutput | BaseException) -> tuple[Handed, list[tuple[Any, PreparedRequest]]]:
        if isinstance(outcome, BaseException):
            raise outcome
        if self.keep:
            earlier = self.finals.get(key)
            self.finals[key] = earlier.followed_by(outcome) if earlier is not None else outcome
        self.ended += outcome.finished
        return [(key, outcome)], []


__all__ = ["Handed", "Program", "Samples"]
