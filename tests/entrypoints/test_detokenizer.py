"""Incremental detokenization (real tokenizer) and stop-string holding."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paternoster.frontend.detokenizer import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    StopStringMatcher,
)

TEXTS = [
    "Hello, world! How are you today?",
    "emoji: 🎉🚀👩‍👩‍👧 done",
    "中文字符测试，日本語のテキスト、한국어 텍스트.",
    "naïve café — déjà vu ½ ∑ π ≈ 3.14159",
    "  leading spaces\n\ttabs and newlines\n\n",
    "mixed 🙂 text 漢字 and ascii 🇫🇷!",
]


def _chunkings(n: int, rng: random.Random) -> list[list[int]]:
    """Split range(n) into runs of 1..3 indices."""
    out, i = [], 0
    while i < n:
        k = rng.randint(1, 3)
        out.append(list(range(i, min(n, i + k))))
        i += k
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_never_emits_broken_characters(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, tokenizer("Prompt:").input_ids)
    deltas = [detok.add([t]) for t in ids]
    deltas.append(detok.flush())
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == tokenizer.decode(ids) == text


def test_multibyte_characters_really_span_tokens(tokenizer):
    """Guard for the test above: single tokens of these texts decode to U+FFFD."""
    ids = tokenizer("🎉🚀 中文字符", add_special_tokens=False).input_ids
    assert any(REPLACEMENT_CHAR in tokenizer.decode([t]) for t in ids)


@pytest.mark.parametrize("seed", range(5))
def test_any_chunking_gives_the_same_text(tokenizer, seed):
    rng = random.Random(seed)
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        detok = IncrementalDetokenizer(tokenizer, [])
        out = "".join(detok.add([ids[i] for i in chunk]) for chunk in _chunkings(len(ids), rng))
        assert out + detok.flush() == text


def test_unfinished_character_is_released_on_flush(tokenizer):
    ids = tokenizer("🎉", add_special_tokens=False).input_ids
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.add(ids[:1]) == ""
    assert REPLACEMENT_CHAR in detok.flush()


def test_special_tokens_are_skipped_and_prompt_is_not_repeated(tokenizer):
    prompt = tokenizer("The answer is").input_ids
    detok = IncrementalDetokenizer(tokenizer, prompt)
    ids = tokenizer(" forty-two", add_special_tokens=False).input_ids
    text = "".join(detok.add([t]) for t in ids)
    assert text == " forty-two"
    assert detok.add([tokenizer.eos_token_id]) == ""
    assert detok.flush() == ""


# --------------------------------------------------------------- stop strings


def _reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Character by character: the first stop string to complete wins."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stops if text[:end].endswith(s)]
        if hits:
            stop = max(hits, key=len)
            return text[: end - len(stop)], stop
    return text, None


def _run_matcher(chunks: list[str], stops: list[str]) -> tuple[list[str], str | None]:
    m = StopStringMatcher(stops)
    emitted, matched = [], None
    for c in chunks:
        safe, matched = m.feed(c)
        emitted.append(safe)
        if matched is not None:
            break
    emitted.append(m.flush())
    return emitted, matched


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="ab c\n", max_size=40),
    stops=st.lists(st.text(alphabet="ab c\n", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
)
def test_stop_strings_never_leak_for_any_chunking(text, stops, cuts):
    points = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    chunks = [text[a:b] for a, b in zip(points, points[1:])]
    emitted, matched = _run_matcher(chunks, stops)
    want, want_stop = _reference(text, stops)
    assert "".join(emitted) == want
    assert matched == want_stop
    # Every prefix emitted so far is a prefix of the final text: nothing is
    # taken back, so no partial stop string ever reached the stream.
    so_far = ""
    for e in emitted:
        so_far += e
        assert want.startswith(so_far)


def test_partial_stop_is_held_then_released():
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc ST") == ("abc ", None)
    assert m.feed("O") == ("", None)
    assert m.feed("P!") == ("", "STOP")
    assert m.flush() == ""
    m = StopStringMatcher(["STOP"])
    assert m.feed("xSTO") == ("x", None)
    assert m.feed("RM") == ("STORM", None)
    m = StopStringMatcher(["\n\n"])
    assert m.feed("line\n") == ("line", None)
    assert m.flush() == "\n"


def test_at_most_longest_stop_minus_one_is_held():
    m = StopStringMatcher(["abcdef", "xy"])
    safe, _ = m.feed("zzzzabcde")
    assert safe == "zzzz"
    assert len(m._held) <= 5
