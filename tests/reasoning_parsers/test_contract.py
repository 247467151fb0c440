"""Every parser on recorded outputs: extract, and the streaming contract (the
streamed reasoning and content fragments concatenate to extract's fields, and
what was streamed so far is always a prefix of them, so no partial tag leaks),
at every split point, every character, and seeded random multi-splits."""

from __future__ import annotations

import functools
import random
import time

import pytest

from paternoster.reasoning_parsers import get_reasoning_parser

from .recordings import RECORDINGS

CASES = [
    pytest.param(p, *case, id=f"{p}-{case[0]}") for p, cases in RECORDINGS.items() for case in cases
]


# The class lookup scans the installed entry points (~6 ms); a stream is ~10 us.
parser_class = functools.cache(get_reasoning_parser)


def make(parser: str):
    return parser_class(parser)()


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
            chunks.append(text[i : i + n])
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


@pytest.mark.parametrize(
    "parser,label,in_reasoning,text,reasoning,content", [c for c in CASES if len(c.values[3]) <= 60]
)
def test_streaming_every_three_piece_split(parser, label, in_reasoning, text, reasoning, content):
    whole = make(parser).extract(text, in_reasoning=in_reasoning)
    n = len(text)
    for i in range(n + 1):
        for j in range(i, n + 1):
            chunks = [text[:i], text[i:j], text[j:]]
            assert stream(parser, chunks, in_reasoning)[:2] == (whole.reasoning, whole.content), (
                chunks
            )


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


@pytest.mark.parametrize(
    "parser,text,in_reasoning,sent",
    [
        ("deepseek_r1", "I think</thi", True, "I think"),
        ("qwen3", "<think>\nI think</", None, "\nI think"),
        ("qwen3", "<thi", False, None),
        ("gpt_oss", "<|channel|>analysis<|message|>I think<|en", None, "I think"),
        (
            "gpt_oss",
            "<|channel|>analysis<|message|>I think<|end|><|start|>assistant<|chan",
            None,
            "I think",
        ),
    ],
)
def test_a_split_tag_is_held_back(parser, text, in_reasoning, sent):
    """The partial tag at the end is sent to neither field until it is decided."""
    s = make(parser).streaming(in_reasoning=in_reasoning)
    streamed = s.feed(text)
    assert streamed.reasoning == sent
    assert streamed.content is None
    assert not s.reasoning_ended


GPT_OSS_CHUNKS = [
    "<|channel|>analysis<|message|>x<|e",
    "nd|><|start|>assistant<|chan",
    "nel|>final<|mess",
    "age|>Done.<|ret",
    "urn|>",
]


@pytest.mark.parametrize(
    "parser,chunks,in_reasoning,reasoning,content,ends_at",
    [
        ("deepseek_r1", ["I think", "</thi", "nk>", "\n\nDone."], True, "I think", "\n\nDone.", 2),
        ("qwen3", ["<th", "ink>", "x", "</", "think>", "Done."], False, "x", "Done.", 4),
        ("gpt_oss", GPT_OSS_CHUNKS, None, "x", "Done.", 3),
    ],
)
def test_reasoning_ends_when_the_end_tag_completes(
    parser, chunks, in_reasoning, reasoning, content, ends_at
):
    """``reasoning_ended`` turns True with the delta that completes the end marker."""
    s = make(parser).streaming(in_reasoning=in_reasoning)
    got_reasoning, got_content, ended = "", "", []
    for chunk in chunks:
        d = s.feed(chunk)
        got_reasoning += d.reasoning or ""
        got_content += d.content or ""
        ended.append(s.reasoning_ended)
    got_content += s.finish().content or ""
    assert (got_reasoning, got_content) == (reasoning, content)
    assert ended == [k >= ends_at for k in range(len(chunks))]


def test_feed_after_finish_raises():
    s = make("qwen3").streaming()
    assert not s.feed("")
    s.finish()
    assert not s.finish()
    with pytest.raises(RuntimeError):
        s.feed("x")


@pytest.mark.parametrize(
    "parser,prefix,suffix,in_reasoning",
    [
        ("deepseek_r1", "", "</think>answer", True),
        ("qwen3", "<think>", "</think>answer", False),
        (
            "gpt_oss",
            "<|channel|>analysis<|message|>",
            "<|end|><|start|>assistant<|channel|>final<|message|>answer",
            None,
        ),
    ],
)
def test_long_stream_in_reasonable_time(parser, prefix, suffix, in_reasoning):
    body = "step é 🤔 < | " * 4000
    text = prefix + body + suffix
    s = make(parser).streaming(in_reasoning=in_reasoning)
    t0 = time.perf_counter()
    deltas = [s.feed(text[k : k + 4]) for k in range(0, len(text), 4)] + [s.finish()]
    assert time.perf_counter() - t0 < 20
    assert "".join(d.reasoning or "" for d in deltas) == body
    assert "".join(d.content or "" for d in deltas) == "answer"


@pytest.mark.parametrize("label", ["tool_call", "preamble_and_call"])
def test_gpt_oss_content_feeds_the_openai_tool_parser(label):
    """The gpt_oss reasoning parser keeps function calls in its content in harmony
    form; the openai tool parser reads them there, streamed or not."""
    from paternoster.tool_parsers import get_tool_parser

    text = next(c[2] for c in RECORDINGS["gpt_oss"] if c[0] == label)
    content = make("gpt_oss").extract(text).content
    whole = get_tool_parser("openai")(seed=0).extract(content)
    assert [(c.name, c.arguments) for c in whole.calls] == [("get_weather", '{"city":"Paris"}')]
    s = make("gpt_oss").streaming()
    tools = get_tool_parser("openai")(seed=0).streaming()
    deltas = [
        tools.feed(d.content or "")
        for k in range(0, len(text), 3)
        for d in [s.feed(text[k : k + 3])]
    ]
    deltas += [tools.feed(s.finish().content or ""), tools.finish()]
    assert "".join(d.content or "" for d in deltas) == (whole.content or "")
    items = [i for d in deltas for i in d.tool_calls]
    assert items[0].name == "get_weather"
    assert "".join(i.arguments for i in items) == '{"city":"Paris"}'
