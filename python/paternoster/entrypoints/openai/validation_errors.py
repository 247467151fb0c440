"""One readable line, and the field at fault, from pydantic's errors on a
request body (FastAPI's ``RequestValidationError``).

pydantic reports a value that fits no member of a union once per member, with
the member's name in the location (``messages.0.content.str``,
``input.list[tagged-union[...]].0.message.content``). The line names the real
path instead, as OpenAI does (``messages[0].content[0].text``), found by
walking the body the client sent, and comes from the member that matched
furthest. Inside ``messages`` (chat) and ``input`` (Responses) the path is
also the ``param``; elsewhere ``param`` is the top-level field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Top-level fields whose items' errors name the item's path as ``param``.
PATH_PARAMS = ("messages", "input")


def field_path(loc: Sequence[Any], body: Any, missing: bool = False) -> list[str | int]:
    """The segments of ``loc`` (``"body"`` dropped) that index into ``body``,
    the parsed JSON the client sent: union-member names are left out. With
    ``missing`` (the error is a missing or unknown field), a last segment
    that is not in ``body`` stays: that field's name.

    Args:
        loc: a pydantic error's ``loc``.
        body: the request body as parsed JSON (``None`` when unknown).
        missing: the error's type is ``missing`` or ``extra_forbidden``.
    """
    segments = [s for s in loc if s != "body"]
    path: list[str | int] = []
    cur = body
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            path.append(seg)
            cur = cur[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cur):
            path.append(seg)
            cur = cur[seg]
        elif last and missing and isinstance(cur, dict) and isinstance(seg, str):
            path.append(seg)  # a missing field
        elif body is None:
            path.append(seg)  # nothing to walk: keep pydantic's location
    return path


def render_path(path: Sequence[str | int]) -> str:
    """``["messages", 0, "content"]`` as ``messages[0].content``."""
    out = ""
    for seg in path:
        out += f"[{seg}]" if isinstance(seg, int) else (f".{seg}" if out else str(seg))
    return out


def describe_errors(errors: Sequence[dict], body: Any) -> tuple[str, str | None]:
    """The line and ``param`` for a body's validation ``errors``.

    The error kept is the one whose path into ``body`` is the longest (the
    union member that matched furthest; the first among equals); the
    messages of every error at that same path are joined with "or".

    Args:
        errors: pydantic's ``errors()`` (non-empty).
        body: the parsed request body, or ``None``.
    Returns:
        ``("<path>: <message>[ (and N more errors)]", param)``.
    """
    paths = [field_path(e.get("loc", ()), body,
                        e.get("type") in ("missing", "extra_forbidden")) for e in errors]
    best = max(range(len(errors)), key=lambda i: (len(paths[i]), -i))
    path = paths[best]
    messages: list[str] = []
    for e, p in zip(errors, paths):
        msg = e.get("msg", "invalid value")
        if p == path and msg not in messages:
            messages.append(msg)
    where = render_path(path)
    text = f"{where}: {', or '.join(messages)}" if where else ", or ".join(messages)
    others = sum(1 for p in paths if p != path[:len(p)])  # not another union member
    if others:
        text += f" (and {others} more error{'s' if others > 1 else ''})"
    top = path[0] if path and isinstance(path[0], str) else None
    param = where if top in PATH_PARAMS and len(path) > 1 else top
    return text, param
