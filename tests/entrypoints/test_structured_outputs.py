"""Structured outputs on the default model, offline (``LLM``) and over HTTP
with the ``openai`` SDK: every constrained output is checked against an
independent reference (the JSON schema with ``jsonschema_rs``, the regex with
Python's ``re``, the choices as a set, the EBNF language by hand), under
sampling, ``n`` > 1, chunked prefill, preemption, a batch mixing constrained
and free rows, streaming and ``max_tokens`` cut-offs; the reasoning gate
(the constraint held back until an end tag, a start tag at the first token,
preemption while reasoning); bad constraints are a 400 naming the field."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema_rs
import pytest

from paternoster import LLM, SamplingParams
from tests.entrypoints.utils import start_server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Give me a person as JSON.", "Describe a cat.", "The weather in Paris is",
           "List three fruits:"]


def _texts(outputs) -> list[str]:
    return [c.text for out in outputs for c in out.outputs]


@pytest.fixture(scope="module")
def tokenizer(llm):
    return llm.tokenizer


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=16, num_threads=2)


def test_json_schema_outputs_validate_under_sampling_and_n(llm):
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=160,
                            structured_outputs={"json": SCHEMA})
    outs = llm.generate(PROMPTS, params)
    validator = jsonschema_rs.validator_for(SCHEMA)
    for out in outs:
        for choice in out.outputs:
            assert choice.finish_reason == "stop", choice.text
            validator.validate(json.loads(choice.text))


def test_regex_choice_grammar_and_json_object(llm):
    word = r"[A-Z][a-z]{2,8} \d{1,3}"
    cases = [
        ({"regex": word}, lambda t: re.fullmatch(word, t)),
        ({"choice": ["yes", "no", "maybe not"]}, lambda t: t in ("yes", "no", "maybe not")),
        ({"grammar": 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'},
         lambda t: re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", t)),
    ]
    for spec, ok in cases:
        params = SamplingParams(temperature=0.8, seed=5, max_tokens=64, structured_outputs=spec)
        for out in llm.generate(PROMPTS, params):
            choice = out.outputs[0]
            assert choice.finish_reason == "stop" and ok(choice.text), (spec, choice.text)
    # Any JSON object: unbounded keys, so greedy (sampled, the tiny model can
    # write one key until max_tokens).
    params = SamplingParams(temperature=0.0, max_tokens=120,
                            structured_outputs={"json_object": True})
    for out in llm.generate(PROMPTS, params):
        choice = out.outputs[0]
        assert choice.finish_reason == "stop", choice.text
        assert isinstance(json.loads(choice.text), dict)


def test_free_rows_are_unchanged_by_constrained_neighbours():
    """In batch-invariant mode, so that only the masks could move a free row."""
    llm = LLM(max_num_seqs=16, num_threads=2, batch_invariant=True)
    free = SamplingParams(temperature=0.0, max_tokens=24)
    alone = _texts(llm.generate(PROMPTS, free))
    constrained = SamplingParams(temperature=0.0, max_tokens=24,
                                 structured_outputs={"choice": ["alpha", "beta"]})
    mixed = llm.generate(PROMPTS + PROMPTS, [free] * 4 + [constrained] * 4)
    assert _texts(mixed[:4]) == alone
    assert all(t in ("alpha", "beta") for t in _texts(mixed[4:]))


def test_max_tokens_cut_off_is_length_not_stop(llm):
    params = SamplingParams(temperature=0.0, max_tokens=4, structured_outputs={"json": SCHEMA})
    choice = llm.generate(PROMPTS[:1], params)[0].outputs[0]
    assert choice.finish_reason == "length"
    assert len(choice.token_ids) == 4
    assert choice.text.startswith("{")


def test_chunked_prefill_and_preemption_keep_outputs_valid():
    llm = LLM(max_num_seqs=8, num_threads=2, scheduler="chunked_prefill",
              max_num_batched_tokens=16, num_kv_blocks=24, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.7, seed=11, max_tokens=120,
                            structured_outputs={"json": SCHEMA})
    long_prompts = [p + " Please answer with care and detail. " * 4 for p in PROMPTS * 2]
    outs = llm.generate(long_prompts, params)
    assert llm.engine.stats()["num_preemptions_total"] > 0
    validator = jsonschema_rs.validator_for(SCHEMA)
    for text in _texts(outs):
        validator.validate(json.loads(text))


def test_a_constraint_the_engine_cannot_compile_is_a_value_error(llm):
    with pytest.raises(ValueError, match="structured_outputs"):
        llm.generate(PROMPTS[:1], SamplingParams(structured_outputs={"regex": "a(b"}))
    with pytest.raises(ValueError, match="admits no output"):
        llm.generate(PROMPTS[:1], SamplingParams(structured_outputs={"grammar": "root ::= root"}))
    assert llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2))[0].outputs[0].token_ids


def test_the_grammar_wins_over_masks_that_leave_it_no_token(llm, tokenizer):
    """allowed_token_ids holding only "yes": after it the grammar needs EOS,
    which the list forbids; the output still ends as the grammar says."""
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert len(yes) == 1
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, seed=1, max_tokens=5,
                                allowed_token_ids=yes,
                                structured_outputs={"choice": ["yes", "no"]})
        choice = llm.generate(PROMPTS[:2], params)[0].outputs[0]
        assert (choice.text, choice.finish_reason) == ("yes", "stop")


def test_ignore_eos_keeps_the_text_the_grammars(llm):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
              "required": ["n"]}
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True,
                            structured_outputs={"json": schema})
    choice = llm.generate(PROMPTS[:1], params)[0].outputs[0]
    assert choice.finish_reason == "length" and len(choice.token_ids) == 30
    assert set(json.loads(choice.text)) == {"n"}


def test_properties_come_in_the_schema_order(llm):
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"},
                                               "alpha": {"type": "integer"}},
              "required": ["zeta", "alpha"]}
    params = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs={"json": schema})
    text = llm.generate(PROMPTS[:1], params)[0].outputs[0].text
    assert list(json.loads(text)) == ["zeta", "alpha"], text


@pytest.mark.parametrize(("spec", "match"), [
    ({"json": {"type": "array", "uniqueItems": True}}, "uniqueItems"),
    ({"json": {"type": "object", "properties": {"a": {"allOf": [{}]}}}}, "allOf"),
    ({"json": {"type": "integer", "multipleOf": 7}}, "multipleOf"),
    ({"json": {"type": "string", "pattern": "(?=x)"}}, "unsupported pattern"),
    ({"choice": ["a\x00b"]}, "NUL"),
])
def test_constraints_xgrammar_would_not_enforce_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(structured_outputs=spec)


# ------------------------------------------------------- the reasoning gate


def _one(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_the_constraint_applies_after_the_end_of_reasoning(llm, tokenizer):
    """The end tag E is forced by logit_bias as the first token (the grammar
    is held back: E is no digit); after it the regex holds."""
    end = _one(tokenizer, " banana")
    params = SamplingParams(temperature=0.0, max_tokens=16, logit_bias={end: 100},
                            structured_outputs={"regex": "[0-9]{3}", "reasoning": {
                                "end": [end], "in_reasoning": True}})
    choice = llm.generate(PROMPTS[:1], params)[0].outputs[0]
    assert choice.token_ids[0] == end and choice.finish_reason == "stop"
    assert choice.text.startswith(" banana")
    assert re.fullmatch("[0-9]{3}", choice.text[len(" banana"):]), choice.text


def test_the_constraint_is_not_applied_before_the_end_of_reasoning(llm, tokenizer):
    """The end tag banned: the whole output is reasoning, the free output."""
    end = _one(tokenizer, " banana")
    free = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={end: -100})
    gated = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={end: -100},
                           structured_outputs={"regex": "[0-9]{3}", "reasoning": {
                               "end": [end], "in_reasoning": True}})
    want, got = (llm.generate(PROMPTS[2:3], p)[0].outputs[0] for p in (free, gated))
    assert got.token_ids == want.token_ids and got.finish_reason == "length"
    assert not re.fullmatch("[0-9]*", got.text), got.text
    # EOS while reasoning (the grammar never ran): the model's choice, "stop".
    eos = tokenizer.eos_token_id
    stopped = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={eos: 100},
                             structured_outputs=gated.structured_outputs)
    choice = llm.generate(PROMPTS[2:3], stopped)[0].outputs[0]
    assert (choice.token_ids, choice.finish_reason) == ([eos], "stop")


def test_a_start_tag_may_open_the_reasoning_at_the_first_token(llm, tokenizer):
    """S (forced) opens the reasoning although the regex forbids it; the
    reasoning is free (S again is banned by bad_words, E forced next); the
    regex holds after E."""
    start, end = _one(tokenizer, " apple"), _one(tokenizer, " banana")
    assert tokenizer.encode(" apple apple", add_special_tokens=False) == [start, start]
    params = SamplingParams(temperature=0.0, max_tokens=16, logit_bias={start: 100, end: 90},
                            bad_words=[" apple apple"],
                            structured_outputs={"regex": "[0-9]{3}", "reasoning": {
                                "end": [end], "start": [start], "in_reasoning": False}},
                            ).prepare(tokenizer)  # the offline LLM does not derive bad_words
    choice = llm.generate(PROMPTS[:1], params)[0].outputs[0]
    assert choice.token_ids[:2] == [start, end] and choice.finish_reason == "stop"
    assert re.fullmatch("[0-9]{3}", tokenizer.decode(choice.token_ids[2:],
                                                     skip_special_tokens=True))
    # Without the start tag in the gate, the same bias cannot move the grammar.
    params = dataclasses.replace(params, structured_outputs={"regex": "[0-9]{3}"})
    assert re.fullmatch("[0-9]{3}", llm.generate(PROMPTS[:1], params)[0].outputs[0].text)


def test_a_gated_request_preempted_while_reasoning_resumes_where_it_was():
    """The gated request (reasoning until a token its free output writes at
    its 5th position or later, then a regex) is preempted while it reasons
    (the others' 46-token prompts fill three blocks each and all grow into a
    fourth together; the victim is the last admitted), and its output is
    token for token the one it has alone (batch-invariant engines)."""
    engine = dict(dtype="bfloat16", batch_invariant=True, num_threads=2, max_model_len=1024,
                  max_num_seqs=8, enable_prefix_caching=False)
    prompt = PROMPTS[2] + " Please answer with care and detail." * 3
    alone = LLM(**engine)
    tokenizer = alone.tokenizer
    free = alone.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12,
                                                   ignore_eos=True))[0].outputs[0].token_ids
    k = next(i for i in range(4, 12) if free[i] not in free[:i])
    params = SamplingParams(temperature=0.0, max_tokens=24, structured_outputs={
        "regex": "[0-9]{3}", "reasoning": {"end": [free[k]], "in_reasoning": True}})
    reference = alone.generate([prompt], params)[0].outputs[0]
    assert reference.token_ids[: k + 1] == free[: k + 1]
    assert re.fullmatch("[0-9]{3}", tokenizer.decode(reference.token_ids[k + 1:],
                                                     skip_special_tokens=True))

    crowded = LLM(**engine, num_kv_blocks=24)
    victims = []  # the gated request's output length when preempted
    preempt = crowded.engine.scheduler.preempt

    def spy(request, out):
        if request.grammar is not None:
            victims.append(request.num_output_tokens)
        return preempt(request, out)

    crowded.engine.scheduler.preempt = spy
    others = [[(7 * i + j) % 4000 + 100 for j in range(46)] for i in range(7)]
    busy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    outs = crowded.generate(others + [tokenizer.encode(prompt)], [busy] * 7 + [params])
    assert victims and all(0 < n <= k for n in victims), (victims, k)  # while reasoning
    assert outs[7].outputs[0].token_ids == reference.token_ids
    assert outs[7].outputs[0].finish_reason == reference.finish_reason == "stop"


# ------------------------------------------------------------------- HTTP


@pytest.fixture(scope="module")
def client(default_model_path):
    from openai import OpenAI

    with start_server(str(default_model_path), "--num-kv-blocks", "512",
                      "--max-model-len", "2048") as srv:
        yield OpenAI(base_url=srv.url + "/v1", api_key="unused")


def test_openai_sdk_parse_with_a_pydantic_model(client):
    from typing import Literal

    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=120)
        colour: Literal["red", "green", "blue"]

    completion = client.chat.completions.parse(
        model=client.models.list().data[0].id, max_tokens=120, temperature=0,
        messages=[{"role": "user", "content": "Invent a person."}], response_format=Person)
    message = completion.choices[0].message
    assert isinstance(message.parsed, Person), message.content
    assert completion.choices[0].finish_reason == "stop"


def test_streamed_json_schema_deltas_concatenate_to_valid_json(client):
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=160, temperature=0.9, seed=2,
        messages=[{"role": "user", "content": "A person, please."}], stream=True,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    jsonschema_rs.validator_for(SCHEMA).validate(json.loads(text))


def test_completions_endpoint_takes_structured_outputs_and_guided_aliases(client):
    model = client.models.list().data[0].id
    for extra in ({"structured_outputs": {"choice": ["left", "right"]}},
                  {"guided_choice": ["left", "right"]}):
        r = client.completions.create(model=model, prompt="Turn", max_tokens=8, n=3,
                                      temperature=1.0, seed=4, extra_body=extra)
        assert {c.text for c in r.choices} <= {"left", "right"}
    r = client.completions.create(model=model, prompt="A JSON object:", max_tokens=60,
                                  temperature=0, extra_body={"response_format":
                                                             {"type": "json_object"}})
    assert isinstance(json.loads(r.choices[0].text), dict), r.choices[0].text


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                 "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs"),
    ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(?=x)"}}}}, "response_format"),
    ({"structured_outputs": {"grammar": "root ::= root"}}, None),
    ({"structured_outputs": {"regex": "a", "reasoning": {"end": [1], "start": [2, 3]}}},
     "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "reasoning": {"end": [10 ** 7]}}},
     "structured_outputs"),
])
def test_bad_constraints_are_a_400_naming_the_field(client, body, param):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body=body)
    assert err.value.body["param"] == param, err.value.body
    # the engine is still up
    r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content is not None
