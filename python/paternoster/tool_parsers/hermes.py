"""Hermes-style tool calls (Hermes 2/3, Qwen2.5, Qwen3).

Format (the Qwen2.5/Qwen3 chat templates)::

    Some text.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {}}
    </tool_call>

Each ``<tool_call>`` holds one JSON object with ``name`` and ``arguments`` (also
accepted: ``parameters``); text around the tags is content.

Malformed: a ``<tool_call>`` whose body is not such an object followed by
``</tool_call>`` (invalid or truncated JSON, unknown function) is content up to
and including the next ``</tool_call>``, or to the end of the text.
"""

from __future__ import annotations

from paternoster.tool_parsers._json import parse_call_object
from paternoster.tool_parsers.base import PENDING, ToolParser, _Call, content_until, skip_ws

START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them."""

    name = "hermes"
    arg_keys = ("arguments", "parameters")

    def _scan(self, text: str, final: bool) -> list:
        items: list = []
        pos = 0
        while True:
            content, i = content_until(text, pos, START, final)
            items.append(content)
            if i < 0:
                return items
            body = i + len(START)
            r = parse_call_object(text, body, self.arg_keys, self.known_function)
            if r.kind == "complete":
                q = skip_ws(text, r.end)
                if text.startswith(END, q):
                    items.append(_Call(r.name, r.arguments, True, i))
                    pos = q + len(END)
                    continue
                if not final and END.startswith(text[q:]):
                    items.append(_Call(r.name, r.arguments, False, i))
                    return items
            elif r.kind != "error" and not final:
                items.append(_Call(r.name, r.arguments, False, i) if r.kind == "partial"
                             else PENDING)
                return items
            # malformed: content up to the next end tag
            j = text.find(END, body)
            if j < 0:
                items.append(PENDING if not final else text[i:])
                return items
            items.append(text[i:j + len(END)])
            pos = j + len(END)
