"""Every parser on recorded outputs: extract, and the streaming contract (the
streamed argument fragments of call i concatenate to extract's arguments of call
i, the streamed content equals extract's), at every split and random chunk sizes."""

from __future__ import annotations

import functools
import json
import random

import pytest

from paternoster.tool_parsers import get_tool_parser
from paternoster.tool_parsers.base import dumps_compact

from .recordings import MALFORMED, WELL_FORMED

WELL = [pytest.param(p, *case, id=f"{p}-{case[0]}") for p, cases in WELL_FORMED.items()
        for case in cases]
BAD = [pytest.param(p, *case, id=f"{p}-{case[0]}") for p, cases in MALFORMED.items()
       for case in cases]


# The class lookup scans the installed entry points (~6 ms); a stream is ~10 us.
parser_class = functools.cache(get_tool_parser)


def make(parser: str, tools, seed: int = 0):
    return parser_class(parser)(tools, seed=seed)


def stream(parser: str, tools, chunks, incremental: bool = True):
    """Feed ``chunks``; returns (content or None, [(id, name, arguments)]) and checks
    the shape of the deltas (id and name exactly once, on a call's first item)."""
    s = make(parser, tools).streaming(incremental_arguments=incremental)
    content = ""
    calls: list[list] = []
    for delta in [*(s.feed(c) for c in chunks), s.finish()]:
        content += delta.content or ""
        for item in delta.tool_calls:
            wire = item.to_openai()
            if item.index == len(calls):
                assert item.id is not None and item.name, wire
                assert wire["type"] == "function" and wire["function"]["name"] == item.name
                calls.append([item.id, item.name, item.arguments])
            else:
                assert item.index < len(calls), wire
                assert item.id is None and item.name is None, wire
                assert "id" not in wire and "name" not in wire["function"]
                calls[item.index][2] += item.arguments
    return content or None, [tuple(c) for c in calls]


def splits(text: str):
    """Character by character, every two-piece split, and seeded random chunks."""
    yield list(text)
    for k in range(len(text) + 1):
        yield [text[:k], text[k:]]
    for seed in range(20):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(1, 12)
            chunks.append(text[i:i + n])
            i += n
        yield chunks


@pytest.mark.parametrize("parser,label,tools,text,content,calls", WELL)
def test_extract_well_formed(parser, label, tools, text, content, calls):
    got = make(parser, tools).extract(text)
    assert got.content == content
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == calls
    for call, (_, args) in zip(got.calls, calls):
        assert call.arguments == dumps_compact(args)  # the canonical form
        assert call.id.startswith("call_") and len(call.id) == 29
    assert got.tools_called == bool(calls)


@pytest.mark.parametrize("parser,label,tools,text,content,calls", WELL)
@pytest.mark.parametrize("incremental", [True, False])
def test_streaming_matches_extract(parser, label, tools, text, content, calls, incremental):
    whole = make(parser, tools).extract(text)
    expected = [(c.name, c.arguments) for c in whole.calls]
    for chunks in splits(text):
        got_content, got_calls = stream(parser, tools, chunks, incremental)
        assert got_content == whole.content, chunks
        assert [(n, a) for _, n, a in got_calls] == expected, chunks


@pytest.mark.parametrize("parser,label,tools,text,content,names", BAD)
def test_malformed_stays_content(parser, label, tools, text, content, names):
    got = make(parser, tools).extract(text)
    assert got.content == content
    assert [c.name for c in got.calls] == names


@pytest.mark.parametrize("parser,label,tools,text,content,names", BAD)
def test_streaming_malformed(parser, label, tools, text, content, names):
    """Content always matches; with whole-call streaming the calls match too; with
    incremental arguments a started call may be left dangling (documented), but
    every call extract finds is streamed with the same arguments, in order."""
    whole = make(parser, tools).extract(text)
    expected = [(c.name, c.arguments) for c in whole.calls]
    for chunks in splits(text):
        got_content, got_calls = stream(parser, tools, chunks, incremental=False)
        assert got_content == whole.content, chunks
        assert [(n, a) for _, n, a in got_calls] == expected, chunks
        got_content, got_calls = stream(parser, tools, chunks, incremental=True)
        assert got_content == whole.content, chunks
        streamed = iter([(n, a) for _, n, a in got_calls])
        assert all(call in streamed for call in expected), (chunks, got_calls)


@pytest.mark.parametrize("parser", sorted(WELL_FORMED))
def test_random_fragments_never_raise(parser):
    """Seeded fuzz: splices of recordings and tag pieces; never raises, and whole-call
    streaming agrees with extract on every input."""
    pieces = [case[2] for case in WELL_FORMED[parser] + MALFORMED[parser]]
    rng = random.Random(1234)
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 3)):
            src = rng.choice(pieces)
            a = rng.randint(0, len(src))
            b = rng.randint(a, len(src))
            parts.append(src[a:b] if rng.random() < 0.6 else src)
        text = "".join(parts)
        tools = rng.choice([None, WELL_FORMED[parser][1][1]])
        whole = make(parser, tools).extract(text)
        chunks = [text[i:i + 3] for i in range(0, len(text), 3)]
        got_content, got_calls = stream(parser, tools, chunks, incremental=False)
        assert got_content == whole.content, text
        assert [(n, a) for _, n, a in got_calls] == [(c.name, c.arguments)
                                                    for c in whole.calls], text
        stream(parser, tools, chunks, incremental=True)
