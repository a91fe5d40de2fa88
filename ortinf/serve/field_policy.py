"""What the server does with every request field a client may send: the compatibility policy.

Each route's fields fall in one of four kinds (docs/compatibility.md is this table, made by `table()`); the rows are
each API front-end's (ortinf/serve/api/<name>/policy.py), this module the rules they are written in and applied by:
- implemented: a field of the route's request model (ortinf/serve/protocol.py), which does what
  OpenAI or vLLM documents for it;
- mapped: an older spelling read as the implemented one (vLLM's `guided_json` is `structured_outputs.json`);
- ignored: accepted, does nothing here, and is named so: in the `X-Ignored-Fields` response header and
  the server log (as vLLM logs them);
- refused: a field whose meaning this server cannot honour (it would change the output): 400 naming
  the field and what to send instead.

A field in no row is treated as ignored, as vLLM treats unknown fields: a client sending a harmless
default must not break, and the header tells it the field did nothing. tests/serve/test_field_policy.py
checks that every field of every request model has its row.
"""

from __future__ import annotations

import functools
import logging

from pydantic import BaseModel

from ortinf.serve.errors import APIError
from ortinf.serve.policy_rules import GUIDED, IGNORED, IMPLEMENTED, MAPPED, REFUSED, Rule  # noqa: F401 - named here too

log = logging.getLogger(__name__)

IGNORED_HEADER = "X-Ignored-Fields"
WARNING_HEADER = "X-Ortinf-Warning"  # what the server did instead of what was asked (tool_choice auto without a parser)
_warned: set[str] = set()


@functools.cache
def policy() -> dict[str, dict[str, Rule]]:
    """Every route's rows: each API front-end's own (its `policy` module, named by its record in ortinf/serve/api)."""
    from ortinf.serve.api import front_ends

    return {route: rules for front in front_ends() for route, rules in front.policy.items()}


MAX_UNKNOWN_FIELDS = 256  # a request with more fields outside its model is refused before any is sorted or escaped


def apply(route: str, body: BaseModel) -> list[str]:
    """The fields of `body` this server ignores (refused ones raise APIError 400). `body` is a request
    model with extra="allow": fields outside the model are in `model_extra`. More than MAX_UNKNOWN_FIELDS of
    them is a 400 at once (an outside attack sent 150,000: sorting and escaping their names for the log and the
    header held the event loop, /health took 1.1 s)."""
    rules = policy()[route]
    extra = body.model_extra or {}
    if len(extra) > MAX_UNKNOWN_FIELDS:
        raise APIError(400, f"the request has {len(extra):,} fields this route does not define (at most {MAX_UNKNOWN_FIELDS}): "
                            "send the documented fields only (docs/compatibility.md)")
    ignored = []
    for name, value in extra.items():
        rule = rules.get(name)
        if rule is not None and rule.kind == REFUSED:
            if value is None or value is False or value == "":
                ignored.append(name)  # a client's explicit "off" of a feature this server lacks asks for nothing
                continue
            raise APIError(400, f"{name} is not supported by this server: {rule.note}", param=name)
        ignored.append(name)
    if ignored:
        log.warning("%s: ignored request fields %s", route, printable(ignored))
    return ignored


def ignored_headers(ignored: list[str]) -> dict[str, str]:
    """The response header naming the ignored fields (none when there are none). A header is printable
    ASCII: other characters of a (client-chosen) field name are escaped, and the list is capped."""
    return {IGNORED_HEADER: printable(ignored)} if ignored else {}


def response_headers(ignored: list[str], warning: str | None = None) -> dict[str, str]:
    """A generating route's headers: the ignored fields, and what the server did instead of what was asked (`warning`:
    a tool plan's, when tool_choice auto is answered as text for want of a tool-call format; logged once)."""
    headers = ignored_headers(ignored)
    if warning:
        headers[WARNING_HEADER] = warning
        warn_once(warning)
    return headers


def printable(names: list[str]) -> str:
    """Field names as one line of printable ASCII (for a header or the log), at most 1,000 characters."""
    escaped = (name.encode("ascii", "backslashreplace").decode("ascii") for name in sorted(names))
    return ", ".join("".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in name) for name in escaped)[:1000]


def warn_once(message: str) -> None:
    """Logs a warning the first time it happens (a response header carries it every time)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def table() -> str:
    """The policy as Markdown (docs/compatibility.md holds it; a docs test keeps them equal)."""
    lines = []
    for route, rules in policy().items():
        lines += [f"### `{route}`", "", "| field | policy | note |", "|---|---|---|"]
        lines += [f"| `{name}` | {rule.kind} | {rule.note} |" for name, rule in rules.items()]
        lines.append("")
    return "\n".join(lines)
