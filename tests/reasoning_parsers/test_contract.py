"""Every parser on recorded outputs: extract, and the streaming contract (the
streamed reasoning and content fragments concatenate to extract's fields, and
what was streamed so far is always a prefix of them, so no partial tag leaks),
at every split point, every character, and seeded random multi-splits."""

from __future__ import annotations

import random
import time

import pytest

from paternoster.reasoning_parsers import get_reasoning_parser

from .recordings import RECORDINGS

CASES = [pytest.param(p, *case, id=f"{p}-{case[0]}") for p, cases in RECORDINGS.items()
         for case in cases]


def make(parser: str):
    return get_reasoning_parser(parser)()


def splits(text: str):
    """Character by character, every two-piece split, and seeded random chunks."""
    yield list(text)
    for k in range(len(text) + 1):
        yield [text[:k], text[k:]]
    for seed in range(30):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(1, 9)
            chunks.append(text[i:i + n])
            i += n
        yield chunks


def stream(parser: str, chunks, in_reasoning, expected=None):
    """Feed ``chunks``; returns (reasoning or None, content or None, reasoning_ended).

    With ``expected`` (extract's result), checks after every delta that what was
    streamed is a prefix of it, and that content only flows once reasoning ended.
    """
    s = make(parser).streaming(in_reasoning=in_reasoning)
    reasoning = content = ""
    for delta in [*(s.feed(c) for c in chunks), s.finish()]:
        assert bool(delta) == bool(delta.reasoning or delta.content)
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        if delta.content:
            assert s.reasoning_ended, chunks
        if expected is not None:
            assert (expected.reasoning or "").startswith(reasoning), chunks
            assert (expected.content or "").startswith(content), chunks
    return reasoning or None, content or None, s.reasoning_ended


@pytest.mark.parametrize("parser,label,in_reasoning,text,reasoning,content", CASES)
def test_extract(parser, label, in_reasoning, text, reasoning, content):
    got = make(parser).extract(text, in_reasoning=in_reasoning)
    assert (got.reasoning, got.content) == (reasoning, content)


@pytest.mark.parametrize("parser,label,in_reasoning,text,reasoning,content", CASES)
def test_streaming_matches_extract(parser, label, in_reasoning, text, reasoning, content):
    whole = make(parser).extract(text, in_reasoning=in_reasoning)
    for chunks in splits(text):
        got = stream(parser, chunks, in_reasoning, whole)
        assert got[:2] == (whole.reasoning, whole.content), chunks


@pytest.mark.parametrize("parser,label,in_reasoning,text,reasoning,content",
                         [c for c in CASES if len(c.values[3]) <= 60])
def test_streaming_every_three_piece_split(parser, label, in_reasoning, text, reasoning,
                                           content):
    whole = make(parser).extract(text, in_reasoning=in_reasoning)
    n = len(text)
    for i in range(n + 1):
        for j in range(i, n + 1):
            chunks = [text[:i], text[i:j], text[j:]]
            assert stream(parser, chunks, in_reasoning)[:2] == (whole.reasoning,
                                                                 whole.content), chunks


@pytest.mark.parametrize("parser", sorted(RECORDINGS))
def test_random_fragments(parser):
    """Seeded fuzz: splices of recordings; streaming agrees with extract on each."""
    pieces = [case[2] for case in RECORDINGS[parser]]
    rng = random.Random(99)
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 3)):
            src = rng.choice(pieces)
            a = rng.randint(0, len(src))
            b = rng.randint(a, len(src))
            parts.append(src[a:b] if rng.random() < 0.6 else src)
        text = "".join(parts)
        in_reasoning = rng.choice([None, True, False])
        whole = make(parser).extract(text, in_reasoning=in_reasoning)
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 8))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        got = stream(parser, chunks, in_reasoning, whole)
        assert got[:2] == (whole.reasoning, whole.content), (text, in_reasoning)


@pytest.mark.parametrize("parser,text,in_reasoning,held", [
    ("deepseek_r1", "I think</thi", True, "</thi"),
    ("qwen3", "<think>\nI think</", None, "</"),
    ("qwen3", "<thi", False, "<thi"),
    ("gpt_oss", "<|channel|>analysis<|message|>I think<|en", None, "<|en"),
    ("gpt_oss", "<|channel|>analysis<|message|>I think<|end|><|start|>assistant<|chan",
     None, ""),
])
def test_a_split_tag_is_held_back(parser, text, in_reasoning, held):
    s = make(parser).streaming(in_reasoning=in_reasoning)
    streamed = s.feed(text)
    assert "<" not in (streamed.reasoning or "").replace("<think>", "")[-len(held) or None:]
    assert not streamed.content
    assert not s.reasoning_ended


@pytest.mark.parametrize("parser,rest,in_reasoning,content", [
    ("deepseek_r1", ["I think", "</thi", "nk>", "\n\nDone."], True, "\n\nDone."),
    ("qwen3", ["<th", "ink>", "x", "</", "think>", "Done."], False, "Done."),
    ("gpt_oss", ["<|channel|>analysis<|message|>x<|e", "nd|><|start|>assistant<|chan",
                 "nel|>final<|mess", "age|>Done.<|ret", "urn|>"], None, "Done."),
])
def test_reasoning_ends_when_the_end_tag_completes(parser, rest, in_reasoning, content):
    s = make(parser).streaming(in_reasoning=in_reasoning)
    reasoning, got, ended_at = "", "", None
    for k, chunk in enumerate(rest):
        d = s.feed(chunk)
        reasoning += d.reasoning or ""
        got += d.content or ""
        if s.reasoning_ended and ended_at is None:
            ended_at = k
    got += s.finish().content or ""
    assert reasoning == "x" if parser != "deepseek_r1" else reasoning == "I think"
    assert got == content
    assert ended_at is not None and ended_at >= 2


def test_feed_after_finish_raises():
    s = make("qwen3").streaming()
    assert not s.feed("")
    s.finish()
    assert not s.finish()
    with pytest.raises(RuntimeError):
        s.feed("x")


@pytest.mark.parametrize("parser,prefix,suffix,in_reasoning", [
    ("deepseek_r1", "", "</think>answer", True),
    ("qwen3", "<think>", "</think>answer", False),
    ("gpt_oss", "<|channel|>analysis<|message|>",
     "<|end|><|start|>assistant<|channel|>final<|message|>answer", None),
])
def test_long_stream_in_reasonable_time(parser, prefix, suffix, in_reasoning):
    body = "step é 🤔 < | " * 4000
    text = prefix + body + suffix
    s = make(parser).streaming(in_reasoning=in_reasoning)
    t0 = time.perf_counter()
    deltas = [s.feed(text[k:k + 4]) for k in range(0, len(text), 4)] + [s.finish()]
    assert time.perf_counter() - t0 < 20
    assert "".join(d.reasoning or "" for d in deltas) == body
    assert "".join(d.content or "" for d in deltas) == "answer"
