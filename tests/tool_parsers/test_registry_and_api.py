"""The registry (built-ins, entry points, errors), call ids, wire shapes, and
that arguments really stream incrementally."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from paternoster import plugins as plugins_module
from paternoster.tool_parsers import (
    BUILTIN_TOOL_PARSERS,
    ToolParser,
    available_tool_parsers,
    get_tool_parser,
    make_tool_call_id,
)
from paternoster.tool_parsers.base import _Call

from .recordings import WELL_FORMED

ROOT = Path(__file__).resolve().parents[2]


def test_every_builtin_loads_and_has_recordings():
    assert sorted(BUILTIN_TOOL_PARSERS) == sorted(WELL_FORMED)
    for name in BUILTIN_TOOL_PARSERS:
        cls = get_tool_parser(name)
        assert issubclass(cls, ToolParser) and cls.name == name
        assert name in available_tool_parsers()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_pyproject_declares_the_builtins_as_entry_points():
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"]["paternoster.tool_parsers"] == BUILTIN_TOOL_PARSERS


def test_unknown_name_lists_the_builtins():
    with pytest.raises(ValueError) as err:
        get_tool_parser("nope")
    message = str(err.value)
    assert "name" in message and "'nope'" in message
    for name in BUILTIN_TOOL_PARSERS:
        assert name in message


class _EntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"thirdparty:{name}", obj

    def load(self):
        return self._obj


class ThirdPartyParser(ToolParser):
    """Everything after ``CALL:`` is a call of ``f`` with no arguments."""

    name = "thirdparty"

    def _scan(self, text, final):
        i = text.find("CALL:")
        if i < 0:
            return [text]
        return [text[:i], _Call("f", "{}", True, i)]


def test_third_party_entry_point(monkeypatch):
    eps = [_EntryPoint("thirdparty", ThirdPartyParser), _EntryPoint("broken", object)]
    monkeypatch.setattr(plugins_module, "entry_points", lambda group: eps)
    assert "thirdparty" in available_tool_parsers()
    cls = get_tool_parser("thirdparty")
    got = cls().extract("hi CALL:")
    assert got.content == "hi" and [c.name for c in got.calls] == ["f"]
    with pytest.raises(ValueError, match="not a ToolParser subclass"):
        get_tool_parser("broken")


def test_call_ids():
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", make_tool_call_id())
    text = WELL_FORMED["hermes"][1][2]
    a = get_tool_parser("hermes")(seed=7).extract(text)
    b = get_tool_parser("hermes")(seed=7).extract(text)
    assert [c.id for c in a.calls] == [c.id for c in b.calls]
    assert len({c.id for c in a.calls}) == 2
    ids = iter(["id-1", "id-2"])
    c = get_tool_parser("hermes")(id_factory=lambda: next(ids)).extract(text)
    assert [x.id for x in c.calls] == ["id-1", "id-2"]


def test_wire_shapes():
    parser = get_tool_parser("hermes")(id_factory=lambda: "call_x")
    call = parser.extract(WELL_FORMED["hermes"][0][2]).calls[0]
    assert call.to_openai() == {"id": "call_x", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city":"Paris","days":3}'}}
    s = parser.streaming()
    first = s.feed('<tool_call>{"name": "get_weather", "arguments": {"a"')
    assert [d.to_openai() for d in first.tool_calls] == [{
        "index": 0, "id": "call_x", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"a"'}}]
    more = s.feed(": 1}}</tool_call>")
    assert [d.to_openai() for d in more.tool_calls] == [
        {"index": 0, "function": {"arguments": ":1}"}}]
    assert not s.finish()
    with pytest.raises(RuntimeError):
        s.feed("x")


def test_tools_accept_bare_function_dicts():
    parser = get_tool_parser("hermes")([{"name": "f", "parameters": {}}])
    assert parser.known_function("f") and not parser.known_function("g")


def test_numbers_keep_their_spelling():
    got = get_tool_parser("hermes")().extract(
        '<tool_call>{"name": "f", "arguments": {"x": 2.50e3, "y": -0}}</tool_call>')
    assert got.calls[0].arguments == '{"x":2.50e3,"y":-0}'
    assert json.loads(got.calls[0].arguments) == {"x": 2500.0, "y": 0}


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "mistral", "openai", "qwen3_coder"])
def test_arguments_stream_incrementally(parser):
    label, tools, text, _, calls = next(c for c in WELL_FORMED[parser] if c[4])
    s = get_tool_parser(parser)(tools).streaming()
    fragments = [item.arguments for ch in text for item in s.feed(ch).tool_calls
                 if item.index == 0 and item.arguments]
    assert len(fragments) > 3, (label, fragments)


def test_long_arguments_stream_in_reasonable_time():
    import time

    value = "x\\\"é" * 3000
    text = '<tool_call>{"name": "f", "arguments": {"s": "' + value + '"}}</tool_call>'
    s = get_tool_parser("hermes")().streaming()
    t0 = time.perf_counter()
    args = "".join(i.arguments for k in range(0, len(text), 4)
                   for i in s.feed(text[k:k + 4]).tool_calls)
    assert time.perf_counter() - t0 < 20
    assert json.loads(args) == {"s": json.loads('"' + value + '"')}


@pytest.mark.parametrize("raw,expected", [
    ('{"e": "\\ud83d\\ude00 ok"}', '{"e":"😀 ok"}'),           # a surrogate pair
    ('{"c": "\\u0001\\t\\/"}', '{"c":"\\u0001\\t/"}'),           # json.dumps's escapes
    ('{"e": "\\ud83d x"}', None),                                # lone high surrogate
    ('{"e": "\\ude00"}', None),                                  # lone low surrogate
    ('{"e": "a\nb"}', None),                                     # raw control character
    ('{"e": "\\x"}', None),                                      # invalid escape
])
def test_string_canonicalization(raw, expected):
    text = '<tool_call>{"name": "f", "arguments": ' + raw + "}</tool_call>"
    got = get_tool_parser("hermes")().extract(text)
    if expected is None:
        assert got.calls == [] and got.content == text
    else:
        assert got.calls[0].arguments == expected
        assert expected == json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":"))
    s = get_tool_parser("hermes")().streaming(incremental_arguments=False)
    streamed = [s.feed(ch) for ch in text] + [s.finish()]
    assert "".join(d.content or "" for d in streamed) == (got.content or "")


def test_long_pythonic_call_streams_in_reasonable_time():
    import time

    text = "[write(path='a.py', body=" + repr("line 'q' (x) [y], {z}\n" * 400) + ")]"
    s = get_tool_parser("pythonic")().streaming()
    t0 = time.perf_counter()
    items = [i for k in range(0, len(text), 4) for i in s.feed(text[k:k + 4]).tool_calls]
    items += s.finish().tool_calls
    assert time.perf_counter() - t0 < 20
    assert [i.name for i in items] == ["write"]
    assert json.loads(items[0].arguments)["body"] == "line 'q' (x) [y], {z}\n" * 400
