"""Pythonic tool calls (Llama 3.2 and Llama 4 style).

Format (the Llama 3.2 lightweight-model and Llama 4 prompt formats)::

    [get_weather(city="Paris", days=3), get_time()]

optionally wrapped in ``<|python_start|>`` ... ``<|python_end|>`` (Llama 4). The
list must open the output (after whitespace); each element is a call of a name
(or dotted name) with keyword arguments only, whose values are Python literals
(strings, numbers, booleans, None, lists, tuples, dicts), parsed with
:mod:`ast`, never evaluated. Text after the list is content.

Streaming: a call is streamed whole once the ``,`` or ``]`` after it arrives.

Malformed: if the list does not parse (an element that is not such a call,
positional arguments, a non-literal or non-JSON value such as a set or NaN, an
unknown function, an unclosed bracket or string), the whole output is content.
"""

from __future__ import annotations

import ast
import re

from paternoster.tool_parsers.base import (
    PENDING,
    ToolParser,
    _Call,
    dumps_compact,
    partial_tag_len,
    skip_ws,
)

START = "<|python_start|>"
END = "<|python_end|>"
_OPEN = "([{"
_CLOSE = ")]}"


_STRINGS = {q: (re.compile(q * 3 + r"(?:[^\\" + q + r"]|\\[\s\S]|" + q + r"(?!" + q * 2 + r"))*"
                             + q * 3),
                  re.compile(q + r"(?:[^\\\n" + q + r"]|\\[\s\S])*" + q))
            for q in "'\""}
_SPECIAL = re.compile(r"""['"()\[\]{},]""")


def _skip_string(text: str, i: int) -> int | None:
    """Index after the Python string literal whose quote is at ``i`` (None: unclosed)."""
    q = text[i]
    triple, single = _STRINGS[q]
    m = (triple if text.startswith(q * 3, i) else single).match(text, i)
    return m.end() if m else None


def _elements(text: str, p: int) -> tuple[list[tuple[int, int]], int | None]:
    """The spans of the complete top-level elements of the list opening at ``p``,
    and the index after its ``]`` (None while the list is open)."""
    spans: list[tuple[int, int]] = []
    depth = 0
    start = p + 1
    i = p + 1
    while True:
        m = _SPECIAL.search(text, i)
        if m is None:
            return spans, None
        i = m.start()
        ch = text[i]
        if ch in "'\"":
            end = _skip_string(text, i)
            if end is None:
                return spans, None
            i = end
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth == 0:
                if ch != "]":
                    raise ValueError("unbalanced")
                spans.append((start, i))
                return spans, i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((start, i))
            start = i + 1
        i += 1


def _func_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _func_name(node.value) + "." + node.attr
    raise ValueError("not a function name")


def parse_call(source: str) -> tuple[str, str]:
    """``name(k=literal, ...)`` as (name, canonical JSON arguments).

    Raises:
        ValueError, SyntaxError, TypeError: not such a call.
    """
    node = ast.parse(source.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("not a keyword-only call")
    parts = []
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs")
        parts.append(dumps_compact(kw.arg) + ":" + dumps_compact(ast.literal_eval(kw.value)))
    return _func_name(node.func), "{" + ",".join(parts) + "}"


class PythonicToolParser(ToolParser):
    """``[f(a=1, b="x"), g()]`` opening the output, literal arguments only."""

    name = "pythonic"

    def _scan(self, text: str, final: bool) -> list:
        p = skip_ws(text, 0)
        if text.startswith(START, p):
            p = skip_ws(text, p + len(START))
        elif not final and p < len(text) and START.startswith(text[p:]):
            return [PENDING]
        if p >= len(text):
            return [text] if final else [PENDING]
        if text[p] != "[":
            return [text]
        try:
            spans, end = _elements(text, p)
            calls = []
            for k, (a, b) in enumerate(spans):
                if not text[a:b].strip() and k == len(spans) - 1 and k > 0 and end is not None:
                    continue  # trailing comma
                name, args = parse_call(text[a:b])
                if not self.known_function(name):
                    raise ValueError("unknown function")
                calls.append(_Call(name, args, True, a))
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            return [text]
        if end is None:
            if final:
                return [text]
            # parsed, but the list may still fail: not complete until it closes
            return [*(_Call(c.name, c.arguments, False, c.start) for c in calls), PENDING]
        if not calls:
            return [text]
        tail = text[end:]
        q = skip_ws(tail, 0)
        if tail.startswith(END, q):
            tail = tail[q + len(END):]
        elif not final:
            held = tail.rstrip()
            if held and END.startswith(held.lstrip()):
                return [*calls, PENDING]
            tail = tail[:len(tail) - partial_tag_len(tail, (END,))]
        return [*calls, tail]
