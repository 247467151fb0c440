"""Parsers of the output a forced ``tool_choice`` constrains the model to.

With ``tool_choice: "required"`` or a named function, the model does not write
its family's tool-call format: a grammar (structured outputs) makes it write
JSON that is a call by construction, as vLLM does:

- ``required``: a list of one or more calls, ``[{"name": ..., "parameters":
  {...}}, ...]`` (at most one call without ``parallel_tool_calls``);
- a named function: the arguments object alone, ``{...}``.

These parsers read that JSON with the same incremental canonicalization as the
family parsers, so the streamed and non-streamed calls agree and the arguments
are canonical compact JSON. Output cut short (``max_tokens``) is not a call: it
stays content. They are internal (chosen by ``tool_choice``, not registered).
"""

from __future__ import annotations

from typing import Any

from paternoster.tool_parsers._json import JsonError, scan_call_list, scan_value
from paternoster.tool_parsers.base import PENDING, ToolParser, _Call, skip_ws


def required_calls_schema(tools: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The JSON schema of ``tool_choice: "required"``'s output.

    Args:
        tools: function name -> its ``parameters`` JSON schema (``{}``: no
            parameters, the empty object, as OpenAI reads an omitted ``parameters``).
        parallel: allow more than one call (``parallel_tool_calls``).
    Returns:
        An array schema of ``{"name", "parameters"}`` objects, one ``anyOf``
        branch per function. Each function's local definitions (``$defs``,
        ``definitions``, as pydantic writes them) move to the root under
        ``<function index>.<name>``, their ``$ref`` rewritten to match: a
        ``#/...`` reference resolves from the root of the whole schema.
    """
    defs: dict[str, Any] = {}
    branches = []
    for k, (name, params) in enumerate(tools.items()):
        params = dict(params or {"type": "object", "properties": {},
                                 "additionalProperties": False})  # fmt: skip
        renames: dict[str, str] = {}
        for key in ("$defs", "definitions"):
            for def_name, sub in (params.pop(key, None) or {}).items():
                renames[f"#/{key}/{def_name}"] = f"#/$defs/{k}.{def_name}"
                defs[f"{k}.{def_name}"] = sub
        branches.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]},
                           "parameters": params},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        })  # fmt: skip
        if renames:
            branches[-1] = _rename_refs(branches[-1], renames)
            for key in [d for d in defs if d.startswith(f"{k}.")]:
                defs[key] = _rename_refs(defs[key], renames)
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": branches}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _rename_refs(node: Any, renames: dict[str, str]) -> Any:
    """``node`` with every ``$ref`` found in ``renames`` (or under one) rewritten."""
    if isinstance(node, list):
        return [_rename_refs(v, renames) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            for old, new in renames.items():
                if value == old or value.startswith(old + "/"):
                    value = new + value[len(old):]
                    break
            out[key] = value
        else:
            out[key] = _rename_refs(value, renames)
    return out


class RequiredToolParser(ToolParser):
    """The ``[{"name": ..., "parameters": {...}}, ...]`` list of ``tool_choice: "required"``."""

    name = "required"

    def _scan(self, text: str, final: bool) -> list:
        p = skip_ws(text, 0)
        if p >= len(text):
            return [text] if final else [PENDING]
        if text[p] != "[":
            return [text]
        state, calls, end = scan_call_list(text, p, self.known_function)
        if state == "complete":
            return [*calls, text[end:]]
        if state == "incomplete" and not final:
            return calls
        return [text]


class NamedToolParser(ToolParser):
    """The arguments object of a named ``tool_choice``: one call of ``function``.

    Args:
        function: the function the request forces.
        **kwargs: as :class:`ToolParser` (``tools``, ``id_factory``, ``seed``).
    """

    name = "named"

    def __init__(self, function: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.function = function

    def _scan(self, text: str, final: bool) -> list:
        p = skip_ws(text, 0)
        if p >= len(text):
            return [text] if final else [PENDING]
        try:
            args, end = scan_value(text, p)
        except JsonError:
            return [text]
        if not args.startswith("{"):
            return [text]
        if end is None:
            return [text] if final else [_Call(self.function, args, False, p)]
        return [_Call(self.function, args, True, p), text[end:]]
