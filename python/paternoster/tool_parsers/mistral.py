"""Mistral tool calls, both generations of the format.

Older tokenizers (v3, e.g. Mistral-7B-Instruct-v0.3, Mixtral-8x22B)::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]

Newer tokenizers (v11+, e.g. Mistral-Small-3.2, Devstral), one tag per call::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

(``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` is accepted too; the model's id is
not used.) Text before the first tag and after the calls is content.

Malformed: a ``[TOOL_CALLS]`` region that does not parse (invalid or truncated
JSON, a list element that is not a call, an unknown function) is content up to
the next ``[TOOL_CALLS]`` or the end of the text; in the list form, the whole
list is content then.
"""

from __future__ import annotations

import re

from paternoster.tool_parsers._json import JsonError, scan_call_list, scan_value
from paternoster.tool_parsers.base import PENDING, ToolParser, _Call, content_until, skip_ws

TAG = "[TOOL_CALLS]"
_NAMED = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9_\-]*)?\[ARGS\]")


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS]`` followed by a JSON list of calls, or by ``name[ARGS]{...}``."""

    name = "mistral"
    skip_special_tokens = False

    def _scan(self, text: str, final: bool) -> list:
        items: list = []
        pos = 0
        while True:
            content, i = content_until(text, pos, TAG, final)
            items.append(content)
            if i < 0:
                return items
            p = skip_ws(text, i + len(TAG))
            if p >= len(text):
                items.append(PENDING if not final else text[i:])
                return items
            if text[p] == "[":
                state, calls, end = scan_call_list(text, p, self.known_function)
            else:
                state, calls, end = self._named(text, p, i)
            if state == "complete":
                items.extend(calls)
                pos = end
                continue
            if state == "incomplete" and not final:
                items.extend(calls)
                return items
            # malformed: content up to the next tag
            content, j = content_until(text, p, TAG, final)
            items.append(text[i:p] + content)
            if j < 0:
                return items
            pos = j

    def _named(self, text: str, p: int, start: int) -> tuple[str, list, int]:
        m = _NAMED.match(text, p)
        if m is None:
            if "{" not in text[p:] and len(text) - p < 256:
                return "incomplete", [PENDING], -1
            return "error", [], -1
        if not self.known_function(m.group(1)):
            return "error", [], -1
        try:
            args, end = scan_value(text, m.end())
        except JsonError:
            return "error", [], -1
        if args and args[0] != "{":
            return "error", [], -1
        if end is None:
            return "incomplete", [_Call(m.group(1), args, False, start)], -1
        return "complete", [_Call(m.group(1), args, True, start)], end
