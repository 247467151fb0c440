"""Qwen3-Coder XML tool calls.

Format (the Qwen3-Coder chat template)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is the text between ``<parameter=P>`` and ``</parameter>`` less one
leading and one trailing newline (the ones the template puts there). Values are
strings, unless the function's JSON schema in ``tools`` gives the parameter the
type ``integer``, ``number``, ``boolean``, ``null``, ``object`` or ``array``
(the first non-null type of a list of types): the value is then converted, and
kept as a string if it does not convert. Arguments keep the parameters' order
(canonical compact JSON, see :mod:`paternoster.tool_parsers.base`).

Malformed: a ``<tool_call>`` that is not exactly a ``<function=NAME>`` of
parameters followed by ``</function>`` and ``</tool_call>`` (missing closing
tags, an unknown function) is content up to and including the next
``</tool_call>``, or to the end of the text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from paternoster.tool_parsers._json import escape
from paternoster.tool_parsers.base import (
    PENDING,
    ToolParser,
    _Call,
    content_until,
    dumps_compact,
    partial_tag_len,
    skip_ws,
)

START = "<tool_call>"
END = "</tool_call>"
FUNC_END = "</function>"
PARAM_END = "</parameter>"
_FUNC = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>")
_TYPES = ("integer", "number", "boolean", "null", "object", "array", "string")


def convert_value(value: str, type_: str | None) -> str:
    """A parameter value as canonical JSON, converted to ``type_`` where it can be."""
    v = value.strip()
    try:
        if v.lower() == "null" and type_ not in (None, "string"):
            return "null"
        if type_ == "integer":
            return dumps_compact(int(v))
        if type_ == "number":
            try:
                return dumps_compact(int(v))
            except ValueError:
                f = float(v)
                if math.isfinite(f):
                    return dumps_compact(f)
        elif type_ == "boolean" and v.lower() in ("true", "false"):
            return v.lower()
        elif type_ in ("object", "array"):
            obj = json.loads(v)
            if isinstance(obj, dict if type_ == "object" else list):
                return dumps_compact(obj)
    except (ValueError, RecursionError):
        pass
    return dumps_compact(value)


class Qwen3CoderToolParser(ToolParser):
    """``<tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>``."""

    name = "qwen3_coder"

    def param_type(self, function: str, param: str) -> str | None:
        """The JSON-schema type of ``param`` of ``function`` in ``tools`` (None: unknown)."""
        schema = (self.tools or {}).get(function) or {}
        props = schema.get("properties")
        prop = props.get(param) if isinstance(props, dict) else None
        t = prop.get("type") if isinstance(prop, dict) else None
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "null")
        return t if t in _TYPES else None

    def _scan(self, text: str, final: bool) -> list:
        items: list = []
        pos = 0
        while True:
            content, i = content_until(text, pos, START, final)
            items.append(content)
            if i < 0:
                return items
            body = i + len(START)
            kind, name, args, end = self._function(text, skip_ws(text, body))
            if kind == "complete":
                q = skip_ws(text, end)
                if text.startswith(END, q):
                    items.append(_Call(name, args, True, i))
                    pos = q + len(END)
                    continue
                if not final and END.startswith(text[q:]):
                    items.append(_Call(name, args, False, i))
                    return items
            elif kind != "error" and not final:
                items.append(_Call(name, args, False, i) if kind == "partial" else PENDING)
                return items
            j = text.find(END, body)
            if j < 0:
                items.append(PENDING if not final else text[i:])
                return items
            items.append(text[i:j + len(END)])
            pos = j + len(END)

    def _function(self, text: str, p: int) -> tuple[str, Any, str, int]:
        m = _FUNC.match(text, p)
        if m is None:
            rest = text[p:]
            if "<function=".startswith(rest) or (
                    rest.startswith("<function=") and not re.search(r"[>\n]", rest)):
                return "pending", None, "", -1
            return "error", None, "", -1
        name = m.group(1).strip()
        if not self.known_function(name):
            return "error", None, "", -1
        args = "{"
        q = m.end()
        while True:
            q = skip_ws(text, q)
            if text.startswith(FUNC_END, q):
                return "complete", name, args + "}", q + len(FUNC_END)
            pm = _PARAM.match(text, q)
            if pm is None:
                rest = text[q:]
                if FUNC_END.startswith(rest) or "<parameter=".startswith(rest) or (
                        rest.startswith("<parameter=") and not re.search(r"[>\n]", rest)):
                    return "partial", name, args, -1
                return "error", None, "", -1
            param = pm.group(1).strip()
            args += ("" if args == "{" else ",") + '"' + escape(param) + '":'
            type_ = self.param_type(name, param)
            vstart = pm.end()
            close = text.find(PARAM_END, vstart)
            if close < 0:
                if type_ in (None, "string"):
                    raw = text[vstart:]
                    if raw.startswith("\n"):
                        raw = raw[1:]
                    raw = raw[:len(raw) - partial_tag_len(raw, ("\n" + PARAM_END, PARAM_END))]
                    args += '"' + escape(raw)
                return "partial", name, args, -1
            value = text[vstart:close]
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            args += convert_value(value, type_)
            q = close + len(PARAM_END)
