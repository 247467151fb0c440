"""Incremental JSON canonicalization, shared by the JSON-based parsers.

:func:`scan_value` reads one JSON value from a prefix of the model's text and
returns the canonical compact form of as much of it as no continuation can
change; :func:`parse_call_object` reads a ``{"name": ..., "arguments": {...}}``
object the same way, so a call's arguments can be streamed as they are generated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from paternoster.tool_parsers.base import PENDING, _Call, dumps_compact, skip_ws

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_TAIL = re.compile(r"[0-9.eE+-]*")
# A string body (up to its closing quote or the end of the text), and a
# truncated escape at the end of the text.
_BODY = re.compile(r'(?:[^"\\\x00-\x1f]+|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*')
_PARTIAL_ESCAPE = re.compile(r"(?:\\(?:u[0-9a-fA-F]{0,3})?)?")


class JsonError(ValueError):
    """The text is not (a prefix of) valid JSON."""


def escape(s: str) -> str:
    """``s`` escaped as in a ``json.dumps(..., ensure_ascii=False)`` string."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _scan_string(text: str, i: int) -> tuple[str, int | None]:
    """The canonical body of the string whose opening quote precedes ``i``, and
    the index after its closing quote (None while it is open)."""
    m = _BODY.match(text, i)
    j = m.end()
    decoded = json.loads('"' + m.group() + '"')
    closed = j < len(text) and text[j] == '"'
    if not closed:
        if not _PARTIAL_ESCAPE.fullmatch(text, j):
            raise JsonError("invalid string")
        if decoded and "\ud800" <= decoded[-1] <= "\udbff":
            decoded = decoded[:-1]  # the low half of the pair may follow
    try:
        decoded.encode("utf-8")
    except UnicodeEncodeError:
        raise JsonError("lone surrogate in string") from None
    return escape(decoded), (j + 1 if closed else None)


def scan_value(text: str, pos: int) -> tuple[str, int | None]:
    """Canonicalize the JSON value starting at ``pos`` (after optional whitespace).

    Returns:
        ``(canonical, end)``: the compact form of the value's stable prefix, and
        the index just after the value, or ``None`` while it is incomplete.
        Numbers keep their spelling; strings are re-escaped as ``json.dumps``
        (``ensure_ascii=False``) escapes them; whitespace outside strings goes.
    Raises:
        JsonError: the text is not a prefix of a JSON value.
    """
    out: list[str] = []
    stack: list[str] = []
    expect = "value"  # value | first_value | first_key | key | colon | comma
    i, n = pos, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
            continue
        if expect in ("first_key", "key"):
            if ch == "}" and expect == "first_key":
                stack.pop()
                out.append("}")
                i += 1
            elif ch == '"':
                body, end = _scan_string(text, i + 1)
                out.append('"' + body)
                if end is None:
                    return "".join(out), None
                out.append('"')
                i = end
                expect = "colon"
                continue
            else:
                raise JsonError("expected a key")
        elif expect == "colon":
            if ch != ":":
                raise JsonError("expected ':'")
            out.append(":")
            i += 1
            expect = "value"
            continue
        elif expect == "comma":
            if ch == ",":
                out.append(",")
                i += 1
                expect = "key" if stack[-1] == "{" else "value"
                continue
            if ch != ("}" if stack[-1] == "{" else "]"):
                raise JsonError("expected ',' or a closing bracket")
            stack.pop()
            out.append(ch)
            i += 1
        else:  # a value
            if ch == "]" and expect == "first_value":
                stack.pop()
                out.append("]")
                i += 1
            elif ch in "{[":
                stack.append(ch)
                out.append(ch)
                i += 1
                expect = "first_key" if ch == "{" else "first_value"
                continue
            elif ch == '"':
                body, end = _scan_string(text, i + 1)
                out.append('"' + body)
                if end is None:
                    return "".join(out), None
                out.append('"')
                i = end
            elif ch == "-" or ch.isdigit():
                m = _NUMBER.match(text, i)
                if m is None:
                    if text[i:] == "-":
                        return "".join(out), None
                    raise JsonError("invalid number")
                if _NUMBER_TAIL.fullmatch(text, m.end()):
                    return "".join(out), None  # the number may go on
                out.append(m.group())
                i = m.end()
            else:
                for word in ("true", "false", "null"):
                    if text.startswith(word, i):
                        out.append(word)
                        i += len(word)
                        break
                    if word.startswith(text[i:]):
                        return "".join(out), None
                else:
                    raise JsonError("invalid value")
        # a value (or a container) just ended
        if not stack:
            return "".join(out), i
        expect = "comma"
    return "".join(out), None


@dataclass(frozen=True)
class CallParse:
    """Result of :func:`parse_call_object`.

    ``kind``: ``error`` (not a valid call), ``pending`` (nothing stable yet),
    ``partial`` (name known, ``arguments`` a canonical prefix) or ``complete``
    (``end`` is the index after the object).
    """

    kind: str
    name: str = ""
    arguments: str = ""
    end: int = -1


_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\\x00-\x1f]|\\.)*)"\s*,\s*"(\w+)"\s*:\s*')
ERROR = CallParse("error")


def parse_call_object(text: str, pos: int, arg_keys: tuple[str, ...],
                      known: Callable[[str], bool]) -> CallParse:
    """Read a ``{"name": NAME, KEY: {...}}`` call object at ``pos``, KEY in ``arg_keys``.

    When ``name`` comes first and the arguments right after it, the arguments are
    canonicalized as they arrive (``partial``); other key orders are reported once
    the object is complete. Extra keys after the arguments are ignored; a missing
    arguments key means ``{}``. The arguments must be an object, the name a
    string that ``known`` accepts.
    """
    p = skip_ws(text, pos)
    m = _HEAD.match(text, p)
    try:
        if m and m.group(2) in arg_keys:
            name = json.loads('"' + m.group(1) + '"')
            if not known(name):
                return ERROR
            args, end = scan_value(text, m.end())
            if args and args[0] != "{":
                return ERROR
            if end is None:
                return CallParse("partial", name, args)
            q = skip_ws(text, end)
            if q >= len(text):
                return CallParse("partial", name, args)
            if text[q] == "}":
                return CallParse("complete", name, args, q + 1)
            if text[q] != ",":
                return ERROR
            _, rest_end = scan_value("{" + text[q + 1:], 0)
            if rest_end is None:
                return CallParse("partial", name, args)
            return CallParse("complete", name, args, q + rest_end)
        _, end = scan_value(text, p)
        if end is None:
            return CallParse("pending")
        obj = json.loads(text[p:end])
    except (ValueError, RecursionError):
        return ERROR
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ERROR
    keys = [k for k in arg_keys if k in obj]
    args_obj = obj[keys[0]] if keys else {}
    if not isinstance(args_obj, dict) or not known(obj["name"]):
        return ERROR
    return CallParse("complete", obj["name"], dumps_compact(args_obj), end)


def _open(calls: list) -> list:
    """The calls of a list that is still open: parsed, but the list may yet fail."""
    return [_Call(c.name, c.arguments, False, c.start) for c in calls]


def scan_call_list(text: str, p: int, known: Callable[[str], bool]) -> tuple[str, list, int]:
    """Read a JSON list of call objects (``{"name": ..., "arguments"|"parameters": {...}}``)
    whose ``[`` is at ``p``.

    Returns:
        ``(state, items, end)``: ``complete`` with the calls and the index after
        the ``]``; ``incomplete`` with the calls so far (not complete: the list
        may yet fail) and a partial call or :data:`PENDING` last; ``error`` when
        the text is not such a list.
    """
    calls: list = []
    q = p + 1
    while True:
        q = skip_ws(text, q)
        if q >= len(text):
            return "incomplete", [*_open(calls), PENDING], -1
        r = parse_call_object(text, q, ("arguments", "parameters"), known)
        if r.kind == "error":
            return "error", [], -1
        if r.kind != "complete":
            partial = _Call(r.name, r.arguments, False, q) if r.kind == "partial" else PENDING
            return "incomplete", [*_open(calls), partial], -1
        calls.append(_Call(r.name, r.arguments, True, q))
        q = skip_ws(text, r.end)
        if q >= len(text):
            return "incomplete", [*_open(calls), PENDING], -1
        if text[q] == "]":
            return "complete", calls, q + 1
        if text[q] != ",":
            return "error", [], -1
        q += 1
