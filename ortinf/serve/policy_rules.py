"""The four kinds a request field's row can have, and the row itself: what ortinf/serve/field_policy.py applies and
each API front-end's policy module (ortinf/serve/api/<name>/policy.py) writes its rows in. Nothing here imports the
server, so the front-ends' records can name their rows without an import circle."""

from __future__ import annotations

from dataclasses import dataclass

IMPLEMENTED, MAPPED, IGNORED, REFUSED = "implemented", "mapped", "ignored", "refused"


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    note: str  # implemented: what it does; mapped: what it becomes; ignored: why; refused: what to send instead


def implemented(note: str) -> Rule:
    return Rule(IMPLEMENTED, note)


def ignored(note: str) -> Rule:
    return Rule(IGNORED, note)


def refused(note: str) -> Rule:
    return Rule(REFUSED, note)


def mapped(target: str) -> Rule:
    return Rule(MAPPED, target)


GUIDED = {  # vLLM's guided decoding fields (before structured_outputs), read as structured_outputs
    "guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
}

__all__ = ["GUIDED", "IGNORED", "IMPLEMENTED", "MAPPED", "REFUSED", "Rule", "ignored", "implemented", "mapped", "refused"]
