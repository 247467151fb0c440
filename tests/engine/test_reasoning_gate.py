"""The reasoning gate of structured outputs, over synthetic token sequences:
the ``reasoning`` key's canonical form and errors, the gate's phases
(:class:`ReasoningGate`), and a real xgrammar grammar (``[0-9]{3}`` over the
default model's tokenizer) held back while the output reasons: which steps
are masked, what the mask allows, where the matcher stands. End to end
through the engine: tests/entrypoints/test_structured_outputs.py."""

from __future__ import annotations

import pytest

from paternoster.frontend.processor import param_of
from paternoster.reasoning_gate import Phase, ReasoningGate
from paternoster.sampling_params import SamplingParams
from paternoster.structured_outputs import (
    GrammarCompiler,
    GrammarState,
    gate_of,
    normalize_spec,
)

xgr = pytest.importorskip("xgrammar")

REGEX = {"regex": "[0-9]{3}"}


# ------------------------------------------------------------------ the spec


def test_the_gate_is_kept_in_canonical_form_after_the_constraint():
    spec = normalize_spec({"reasoning": {"end": [7, 8]}, "regex": "a+"})
    assert list(spec) == ["regex", "reasoning"]
    assert spec["reasoning"] == {"end": [7, 8], "start": [], "in_reasoning": False}
    assert normalize_spec(spec) == spec  # idempotent
    assert normalize_spec({"regex": "a+", "reasoning": None}) == {"regex": "a+"}


@pytest.mark.parametrize(("gate", "match"), [
    ("yes", r"structured_outputs\.reasoning must be an object"),
    ({"end": [1], "stop": [2]}, r"structured_outputs\.reasoning: unknown keys \['stop'\]"),
    ({}, r"structured_outputs\.reasoning\.end must be a non-empty list"),
    ({"end": []}, r"structured_outputs\.reasoning\.end must be a non-empty list"),
    ({"end": ["</think>"]}, r"structured_outputs\.reasoning\.end must be a non-empty list"),
    ({"end": [True]}, r"structured_outputs\.reasoning\.end"),
    ({"end": [1], "start": 5}, r"structured_outputs\.reasoning\.start must be a list"),
    ({"end": [1], "start": [5, 6]}, r"structured_outputs\.reasoning\.start must be at most one"),
    ({"end": [1], "in_reasoning": 1}, r"structured_outputs\.reasoning\.in_reasoning"),
])
def test_bad_gates_are_refused_naming_the_field(gate, match):
    with pytest.raises(ValueError, match=match):
        normalize_spec({"regex": "a", "reasoning": gate})


def test_a_gate_alone_is_no_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        normalize_spec({"reasoning": {"end": [1]}})


@pytest.mark.parametrize("gate", [{"end": [1, 60000]}, {"end": [1], "start": [-1]}])
def test_gate_token_ids_are_checked_against_the_vocabulary(gate):
    params = SamplingParams(structured_outputs={**REGEX, "reasoning": gate})
    with pytest.raises(ValueError, match=r"structured_outputs\.reasoning\.(end|start) must be"
                                         r" token ids in \[0, 49152\)") as err:
        params.check_token_ids(49152)
    assert param_of(err.value) == "structured_outputs"
    SamplingParams(structured_outputs={**REGEX, "reasoning": {"end": [49151]}}).check_token_ids(
        49152)


# ------------------------------------------------------------- the gate alone


def test_a_gate_that_never_holds_back_is_none():
    assert ReasoningGate.from_spec(None) is None
    assert ReasoningGate.from_spec({"end": [1], "start": [], "in_reasoning": False}) is None


def test_a_multi_token_end_tag_is_found_across_steps_once():
    gate = ReasoningGate([5, 6], None, in_reasoning=True)
    output: list[int] = []
    for token in [5, 1, 6, 5]:
        output.append(token)
        assert gate.find_end(output) is None
    output.append(6)
    assert gate.find_end(output) == 5
    assert gate.phase is Phase.ANSWERING


def test_the_end_tag_is_searched_after_the_start_tag():
    """A start tag equal to the end's first token does not half-close it."""
    gate = ReasoningGate([9, 6], 9, in_reasoning=False)
    assert gate.start_token == 9
    assert gate.opens_reasoning(9) and gate.start_token is None
    assert gate.find_end([9, 6]) is None
    assert gate.find_end([9, 6, 9, 6]) == 4


# ------------------------------------------------ with a real xgrammar grammar


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from paternoster.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def _one(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _state(compiler, gate: dict | None) -> GrammarState:
    spec = normalize_spec({**REGEX, "reasoning": gate})
    return GrammarState(compiler.compile_async(spec), compiler.vocab_size, gate_of(spec))


def _allowed(state: GrammarState, vocab_size: int) -> set[int]:
    """The tokens ``state.fill_bitmask`` allows."""
    import numpy as np

    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    state.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    return set(np.nonzero(bits[0, :vocab_size])[0].tolist())


def _run(state: GrammarState, tokens: list[int], vocab_size: int) -> list[set[int] | None]:
    """Step the state through ``tokens`` as the sampler does: each step's
    allowed set (None: the row is not masked), every masked token accepted."""
    output: list[int] = []
    steps: list[set[int] | None] = []
    for token in tokens:
        if state.constrains_next(output):
            steps.append(_allowed(state, vocab_size))
            assert state.accept(token), (token, output)
        else:
            steps.append(None)
        output.append(token)
    return steps


@pytest.fixture(scope="module")
def ids(tokenizer):
    digits = [_one(tokenizer, d) for d in "0123456789"]
    return {"digits": set(digits), "1": digits[1], "2": digits[2], "3": digits[3],
            "E": _one(tokenizer, " banana"), "S": _one(tokenizer, " apple"),
            "w": _one(tokenizer, " the"), "eos": tokenizer.eos_token_id}


def test_in_reasoning_holds_the_grammar_back_until_the_end_tag(compiler, ids):
    state = _state(compiler, {"end": [ids["E"]], "in_reasoning": True})
    reasoning = [ids["w"], ids["S"], ids["w"], ids["E"]]
    answer = [ids["1"], ids["2"], ids["3"], ids["eos"]]
    steps = _run(state, reasoning + answer, compiler.vocab_size)
    assert steps[:4] == [None] * 4  # not masked, matcher not advanced
    assert steps[4] == steps[5] == steps[6] == ids["digits"]  # the regex from the 1st answer token
    assert steps[7] == {ids["eos"]}
    assert state.terminated and state.gate is None


def test_without_the_end_tag_the_grammar_never_starts(compiler, ids):
    state = _state(compiler, {"end": [ids["E"]], "in_reasoning": True})
    assert _run(state, [ids["w"], ids["S"], ids["1"]] * 3, compiler.vocab_size) == [None] * 9
    assert state._matcher is None  # never built, never advanced
    assert state.gate.phase is Phase.REASONING


def test_a_start_tag_at_the_first_token_opens_the_reasoning(compiler, ids):
    state = _state(compiler, {"end": [ids["E"]], "start": [ids["S"]]})
    tokens = [ids["S"], ids["w"], ids["S"], ids["E"], ids["1"], ids["2"], ids["3"], ids["eos"]]
    steps = _run(state, tokens, compiler.vocab_size)
    assert steps[0] == ids["digits"] | {ids["S"]}  # the grammar's set plus the start tag
    assert steps[1:4] == [None] * 3
    assert steps[4] == ids["digits"]
    assert steps[7] == {ids["eos"]}
    assert state.terminated


def test_another_first_token_is_the_answers(compiler, ids):
    state = _state(compiler, {"end": [ids["E"]], "start": [ids["S"]]})
    steps = _run(state, [ids["1"], ids["2"], ids["3"], ids["eos"]], compiler.vocab_size)
    assert steps[0] == ids["digits"] | {ids["S"]}
    assert steps[1] == steps[2] == ids["digits"]  # the start tag is no longer allowed
    assert steps[3] == {ids["eos"]}
    assert state.terminated and state.gate is None


def test_tokens_past_the_end_tag_are_replayed_into_the_grammar(compiler, ids):
    """The gate reads the output itself: a state that missed steps (or a
    rebuilt one) catches up with the tokens after the tag."""
    state = _state(compiler, {"end": [ids["E"]], "in_reasoning": True})
    assert state.constrains_next([ids["w"], ids["E"], ids["1"], ids["2"]])
    assert _allowed(state, compiler.vocab_size) == ids["digits"]
    assert state.accept(ids["3"]) and state.accept(ids["eos"]) and state.terminated


def test_the_compile_cache_ignores_the_gate(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    futures = {id(compiler.compile_async(normalize_spec({**REGEX, "reasoning": gate})))
               for gate in (None, {"end": [5]}, {"end": [6], "in_reasoning": True})}
    assert len(futures) == 1 and compiler.num_compiles == 1
