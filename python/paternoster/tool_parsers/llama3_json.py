"""Llama 3.x JSON tool calls.

Format (Llama 3.1/3.2/3.3 model cards, "JSON based tool calling")::

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally preceded by ``<|python_tag|>``; several calls are separated by ``;``.
The calls must open the output (after whitespace and the optional tag); text
after the last call is content (``arguments`` is accepted for ``parameters``).

Malformed: output that does not open with a valid call object (other text, a
JSON object without ``name``, truncated JSON, unknown function) is content in
full; after at least one valid call, the text from the first invalid one on is
content.
"""

from __future__ import annotations

from paternoster.tool_parsers._json import parse_call_object
from paternoster.tool_parsers.base import PENDING, ToolParser, _Call, skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """``{"name": ..., "parameters": {...}}`` calls, ``;``-separated, opening the output."""

    name = "llama3_json"
    arg_keys = ("parameters", "arguments")

    def _scan(self, text: str, final: bool) -> list:
        p = skip_ws(text, 0)
        if text.startswith(PYTHON_TAG, p):
            p = skip_ws(text, p + len(PYTHON_TAG))
        elif not final and p < len(text) and PYTHON_TAG.startswith(text[p:]):
            return [PENDING]
        calls: list = []
        pos = p
        while True:
            q = skip_ws(text, pos)
            if q >= len(text):
                if calls or final:
                    return [*calls, text[pos:]] if calls else [text]
                return [PENDING]
            r = parse_call_object(text, q, self.arg_keys, self.known_function)
            if r.kind == "error" or (final and r.kind != "complete"):
                return [*calls, text[pos:]] if calls else [text]
            if r.kind == "pending":
                return [*calls, PENDING]
            if r.kind == "partial":
                return [*calls, _Call(r.name, r.arguments, False, q)]
            calls.append(_Call(r.name, r.arguments, True, q))
            after = skip_ws(text, r.end)
            if after < len(text) and text[after] == ";":
                pos = after + 1
                continue
            if after >= len(text) and not final:
                return [*calls, PENDING]  # a ';' may follow
            return [*calls, text[r.end:]]
