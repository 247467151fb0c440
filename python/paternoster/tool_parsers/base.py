"""The tool-parser interface: model text in, OpenAI-shaped tool calls out.

A parser turns the text a model generated into ``content`` plus a list of
:class:`ToolCall` (``extract``), or does the same incrementally from text deltas
(:class:`StreamingToolParser`), yielding OpenAI ``tool_calls`` delta items.

Canonical arguments: every parser reports a call's ``arguments`` as compact JSON,
the form of ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``
(no insignificant whitespace, strings escaped as ``json.dumps`` escapes them,
non-ASCII kept). Where the model wrote JSON, numbers keep the spelling the model
gave them and key order is kept. Both paths produce this same text, so the
streamed argument fragments of a call concatenate to its non-streamed arguments.

Content: the text outside the calls, concatenated, with the whitespace directly
before a call and directly after one dropped; ``None`` when nothing is left.

Malformed output never raises: a call that does not parse (truncated JSON,
garbage inside the tags, a function not among ``tools`` when ``tools`` is given)
stays content. Each parser module documents where such a region ends.

Streaming limit: a call whose id and name were already streamed and which then
turns out malformed (the generation stops mid-arguments, garbage follows) cannot
be taken back; its text is then also streamed as content at :meth:`finish`, so
the streamed content still equals ``extract``'s. Pass
``incremental_arguments=False`` to :meth:`ToolParser.streaming` to stream each
call only once it is complete (closed, and, for the list formats, its list
closed too), which makes both paths agree on every input.
"""

from __future__ import annotations

import json
import random
import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

_ALNUM = string.ascii_letters + string.digits


def make_tool_call_id(rng: random.Random | None = None) -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 random letters and digits.

    Args:
        rng: a seeded generator for reproducible ids; ``None`` uses :mod:`secrets`.
    """
    if rng is None:
        return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))
    return "call_" + "".join(rng.choice(_ALNUM) for _ in range(24))


def dumps_compact(value: Any) -> str:
    """``value`` as canonical compact JSON (the form of every call's ``arguments``).

    Raises:
        TypeError, ValueError: ``value`` is not JSON-serializable (NaN and
            infinities included).
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call: ``arguments`` is canonical compact JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The call as an item of an OpenAI chat message's ``tool_calls``."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ExtractedToolCalls:
    """What :meth:`ToolParser.extract` found: the content and the calls, in order."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def tools_called(self) -> bool:
        """Whether at least one call was found."""
        return bool(self.calls)


@dataclass(frozen=True)
class ToolCallDelta:
    """One item of an OpenAI streaming ``delta.tool_calls``.

    ``id`` and ``name`` are set only on the first item of a call; the following
    items carry ``arguments`` fragments only.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The item as OpenAI's wire form (``type``/``id``/``name`` only when set)."""
        function: dict[str, Any] = {"arguments": self.arguments}
        item: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            item["id"] = self.id
            item["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        item["function"] = function
        return item


@dataclass(frozen=True)
class StreamDelta:
    """What one fed delta produced: a ``content`` fragment and tool call items.

    Falsy when it carries nothing (nothing to send to the client).
    """

    content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content) or bool(self.tool_calls)


@dataclass(frozen=True)
class _Call:
    """A call as a scan sees it: ``name`` None is a pending region (held back).

    ``complete``: no continuation of the text can change the call any more (its
    closing tag, or the list holding it, has been read); ``start`` is its offset
    in the text, which identifies it from one scan to the next.
    """

    name: str | None
    arguments: str
    complete: bool
    start: int = -1


PENDING = _Call(None, "", False)
"""Scan item: text from here on may be a call; nothing after it is stable yet."""

def skip_ws(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not JSON whitespace."""
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def content_until(text: str, start: int, tag: str, final: bool) -> tuple[str, int]:
    """The content from ``start`` up to the next ``tag`` and that tag's index,
    or, without one, the rest of the text and -1 (less a suffix that could
    begin ``tag`` unless ``final``: it may be the tag arriving)."""
    i = text.find(tag, start)
    if i >= 0:
        return text[start:i], i
    tail = text[start:]
    if not final:
        tail = tail[:len(tail) - partial_tag_len(tail, (tag,))]
    return tail, -1


def partial_tag_len(text: str, tags: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a tag."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def _normalize(items: list, final: bool) -> list:
    """Merge adjacent content, drop whitespace next to calls (and, while
    streaming, trailing whitespace, which may turn out to precede a call)."""
    merged: list = []
    for it in items:
        if isinstance(it, str):
            if not it:
                continue
            if merged and isinstance(merged[-1], str):
                merged[-1] += it
                continue
        merged.append(it)
    out: list = []
    last = len(merged) - 1
    for k, it in enumerate(merged):
        if isinstance(it, str):
            if k > 0:
                it = it.lstrip()
            if k < last or not final:
                it = it.rstrip()
            if it:
                out.append(it)
        else:
            out.append(it)
    return out


class ToolParser(ABC):
    """Base class of the tool-call parsers of one model family's format.

    Subclasses implement :meth:`_scan`, a pure function of the whole text so far;
    :meth:`extract` and :class:`StreamingToolParser` are built on it, which is what
    keeps the streamed and the non-streamed results equal.

    Args:
        tools: the request's OpenAI ``tools`` (``{"type": "function", "function":
            {"name", "parameters"}}`` items, or the bare ``function`` dicts). When
            given, a call to a function not listed stays content; some parsers
            also read the parameter types from the JSON schemas.
        id_factory: makes the call ids (overrides ``seed``).
        seed: seeds the id generator (reproducible ids, for tests); by default ids
            are random (:func:`make_tool_call_id`).
    """

    name: ClassVar[str] = ""
    #: False when the format's tags are special tokens, which detokenization
    #: would drop: the server then keeps special tokens in the text (vLLM does
    #: the same for Mistral's ``[TOOL_CALLS]`` and gpt-oss's harmony tags).
    skip_special_tokens: ClassVar[bool] = True

    def __init__(self, tools: Iterable[Any] | None = None, *,
                 id_factory: Callable[[], str] | None = None, seed: int | None = None):
        self.tools: dict[str, dict[str, Any]] | None = None
        if tools is not None:
            self.tools = {}
            for tool in tools:
                fn = _as_dict(tool)
                fn = _as_dict(fn.get("function", fn))
                if isinstance(fn.get("name"), str):
                    params = fn.get("parameters")
                    self.tools[fn["name"]] = params if isinstance(params, Mapping) else {}
        if id_factory is None:
            rng = random.Random(seed) if seed is not None else None
            id_factory = lambda: make_tool_call_id(rng)  # noqa: E731
        self._id_factory = id_factory

    def new_call_id(self) -> str:
        """A fresh tool call id from this parser's id factory."""
        return self._id_factory()

    def known_function(self, name: str) -> bool:
        """Whether ``name`` may be called: any name without ``tools``, else a listed one."""
        return bool(name) and (self.tools is None or name in self.tools)

    @abstractmethod
    def _scan(self, text: str, final: bool) -> list:
        """Split ``text`` into content strings and :class:`_Call` items, in order.

        With ``final`` False the text may still grow: only what no continuation
        can change may be reported (a partial call last, or :data:`PENDING`).
        With ``final`` True every call reported is complete and every malformed
        region is content.
        """

    def scan(self, text: str, final: bool) -> list:
        """:meth:`_scan`, normalized, falling back to all-content if it raises."""
        try:
            return _normalize(self._scan(text, final), final)
        except Exception:  # a parser bug must not fail the request: keep the text
            return _normalize([text], final) if final else []

    def scan_calls(self, text: str) -> list[tuple[str, str]]:
        """The complete calls of a finished generation as ``(name, arguments)``
        (what :meth:`extract` would return, without making ids)."""
        return [(it.name, it.arguments) for it in self.scan(text, True)
                if isinstance(it, _Call) and it.name is not None]  # fmt: skip

    def extract(self, text: str) -> ExtractedToolCalls:
        """Parse a complete generation.

        Returns:
            The content (``None`` if empty) and the calls with fresh ids. Never
            raises: anything that does not parse is content.
        """
        items = self.scan(text, True)
        content = "".join(it for it in items if isinstance(it, str))
        calls = [ToolCall(self.new_call_id(), it.name, it.arguments)
                 for it in items if isinstance(it, _Call) and it.name is not None]
        return ExtractedToolCalls(content or None, calls)

    def streaming(self, *, incremental_arguments: bool = True) -> StreamingToolParser:
        """A fresh incremental parser for one generation (see :class:`StreamingToolParser`)."""
        return StreamingToolParser(self, incremental_arguments=incremental_arguments)


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    return dump() if callable(dump) else {}


class StreamingToolParser:
    """Incremental parsing of one generation: :meth:`feed` deltas, then :meth:`finish`.

    Each call returns a :class:`StreamDelta`: new content, and for each call an
    item with ``index``, ``id`` and ``name`` when it starts, then ``arguments``
    fragments. Text that may still become a call (a partial start tag, trailing
    whitespace) is held back until it is decided.

    Args:
        parser: the format's :class:`ToolParser` (its tools and id factory are used).
        incremental_arguments: stream arguments as they are generated (default);
            False streams each call in one item once it is complete.
    """

    def __init__(self, parser: ToolParser, *, incremental_arguments: bool = True):
        self.parser = parser
        self.incremental_arguments = incremental_arguments
        self._text = ""
        self._content = ""
        self._calls: dict[int, list] = {}  # start offset -> [index, name, arguments sent]
        self._finished = False

    @property
    def text(self) -> str:
        """All the text fed so far."""
        return self._text

    def feed(self, delta: str) -> StreamDelta:
        """Add generated text; returns what can be sent for it (possibly nothing).

        Raises:
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not delta:
            return StreamDelta()
        self._text += delta
        return self._diff(self.parser.scan(self._text, False))

    def finish(self) -> StreamDelta:
        """End of generation: flush what was held back (malformed calls as content)."""
        if self._finished:
            return StreamDelta()
        self._finished = True
        return self._diff(self.parser.scan(self._text, True))

    def _diff(self, items: list) -> StreamDelta:
        content = "".join(it for it in items if isinstance(it, str))
        new_content = ""
        if content.startswith(self._content):
            new_content = content[len(self._content):]
            self._content = content
        out: list[ToolCallDelta] = []
        for it in items:
            if not isinstance(it, _Call) or it.name is None:
                continue
            if not it.complete and not self.incremental_arguments:
                continue
            sent = self._calls.get(it.start)
            if sent is None:
                index = len(self._calls)
                self._calls[it.start] = [index, it.name, it.arguments]
                out.append(ToolCallDelta(index, self.parser.new_call_id(), it.name,
                                         it.arguments))
            elif sent[1] == it.name and it.arguments.startswith(sent[2]):
                fragment = it.arguments[len(sent[2]):]
                if fragment:
                    sent[2] = it.arguments
                    out.append(ToolCallDelta(sent[0], arguments=fragment))
        return StreamDelta(new_content or None, out)
