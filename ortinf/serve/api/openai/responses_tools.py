"""The Responses API's `tools` as the chat path's function tools.

- `function`: a function tool (flat, where chat completions nest it under `function`).
- `namespace`: a named group of function tools (Codex sends `multi_agent_v1`). The model sees each as a function;
  a call comes back as a function_call item with the function's own name and its `namespace`, as OpenAI's API
  answers. A name two groups (or a group and a plain tool) share is shown to the model as `namespace.name`.
- Hosted tools (web_search, file_search, code_interpreter, image_generation, computer use, mcp, custom, ...): run
  by the vendor's servers, not by a client. With `--hosted-tools ignore` (the default: Codex declares web_search on
  every request) they are left out of what the model sees and named in X-Ignored-Fields; `refuse` answers 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortinf.serve.errors import APIError

FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass(slots=True)
class ResponsesTools:
    chat: list[dict] | None  # the chat completion's tools
    names: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # the model's name -> (namespace, the client's name)
    ignored: list[str] = field(default_factory=list)  # "tools.N (type)", for X-Ignored-Fields

    def call_item(self, item: dict) -> dict:
        """A function_call output item with the client's name and namespace for the model's name."""
        namespace, name = self.names.get(item["name"], (None, item["name"]))
        return {**item, "name": name, **({"namespace": namespace} if namespace is not None else {})}

    def model_name(self, name: str, namespace: str | None) -> str:
        """The name the model knows a call of an earlier turn by (an input function_call item's name and namespace)."""
        if namespace is None:
            return name
        return next((shown for shown, (space, own) in self.names.items() if space == namespace and own == name), name)


def _function(tool: dict, where: str) -> dict:
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise APIError(400, f"{where}: a function tool needs a name", param="tools")
    return {key: tool[key] for key in FUNCTION_KEYS if tool.get(key) is not None}


def read_tools(tools: list[dict] | None, hosted: str = "ignore") -> ResponsesTools:
    """The request's tools read (`hosted`: --hosted-tools, ignore or refuse)."""
    if not tools:
        return ResponsesTools(None)
    found: list[tuple[str | None, dict]] = []  # (namespace, function)
    ignored = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            found.append((None, _function(tool, where)))
        elif kind == "namespace":
            if not isinstance(tool.get("name"), str) or not isinstance(tool.get("tools"), list):
                raise APIError(400, f"{where}: a namespace tool needs a name and a list of tools", param="tools")
            for position, inner in enumerate(tool["tools"]):
                inner_kind = inner.get("type") if isinstance(inner, dict) else None
                if inner_kind != "function":
                    if hosted == "refuse":
                        raise APIError(400, f"{where}.tools.{position}: a namespace may hold function tools here, not "
                                            f"'{str(inner_kind)[:40]}'", param="tools")
                    ignored.append(f"{where}.tools.{position} ({str(inner_kind)[:40]})")
                    continue
                found.append((tool["name"], _function(inner, f"{where}.tools.{position}")))
        elif hosted == "refuse" or not isinstance(kind, str):
            raise APIError(400, f"{where}: tools of type '{str(kind)[:40]}' are not supported: this server runs no hosted tools; "
                                "declare a function tool (or serve with --hosted-tools ignore to leave them out)", param="tools")
        else:
            ignored.append(f"{where} ({kind[:40]})")
    counts: dict[str, int] = {}
    for _, function in found:
        counts[function["name"]] = counts.get(function["name"], 0) + 1
    names: dict[str, tuple[str | None, str]] = {}
    chat = []
    for namespace, function in found:
        shown = function["name"] if namespace is None or counts[function["name"]] == 1 else f"{namespace}.{function['name']}"
        if shown in names:
            raise APIError(400, f"tools: two tools are named '{shown[:80]}': give each a different name", param="tools")
        names[shown] = (namespace, function["name"])
        chat.append({"type": "function", "function": {**function, "name": shown}})
    return ResponsesTools(chat or None, {k: v for k, v in names.items() if v[0] is not None}, ignored)


__all__ = ["ResponsesTools", "read_tools"]
