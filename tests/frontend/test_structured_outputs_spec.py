"""The ``structured_outputs`` map: its canonical form (no xgrammar), and
xgrammar's parse of each kind of constraint, a bad one refused naming it;
the choice grammar accepts exactly its strings (checked with xgrammar's own
matcher on the strings, as its spec defines acceptance)."""

from __future__ import annotations

import json

import pytest

from paternoster.structured_outputs import MAX_SPEC_CHARS, check_spec, normalize_spec

xgr = pytest.importorskip("xgrammar")


def test_json_schema_is_compact_text_in_the_schemas_order():
    """Property order is kept (it is the order of the generated keys)."""
    a = normalize_spec({"json": {"type": "object", "properties": {"b": {}, "a": {}}}})
    b = normalize_spec({"json": '{"type": "object",  "properties": {"b": {}, "a": {}}}'})
    assert a == b == {"json": '{"type":"object","properties":{"b":{},"a":{}}}'}
    assert list(json.loads(a["json"])["properties"]) == ["b", "a"]


@pytest.mark.parametrize(("spec", "match"), [
    ("not a map", "must be an object"),
    ({}, "exactly one"),
    ({"json": {}, "regex": "a"}, "exactly one"),
    ({"jsn": {}}, "unknown keys"),
    ({"json": "{not json"}, r"structured_outputs\.json is not valid JSON"),
    ({"json": [1, 2]}, r"structured_outputs\.json must be a JSON schema object"),
    ({"regex": ""}, r"structured_outputs\.regex must be a non-empty string"),
    ({"choice": []}, r"structured_outputs\.choice must be a non-empty list"),
    ({"choice": ["a", 3]}, r"structured_outputs\.choice"),
    ({"json_object": "yes"}, r"structured_outputs\.json_object must be true"),
    ({"grammar": "x" * (MAX_SPEC_CHARS + 1)}, "longer than"),
])
def test_bad_maps_are_refused_naming_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        normalize_spec(spec)


@pytest.mark.parametrize(("spec", "match"), [
    ({"json": {"type": "nonsense"}}, r"structured_outputs\.json: invalid JSON schema"),
    ({"regex": "a(b"}, r"structured_outputs\.regex: invalid regular expression"),
    ({"grammar": "root ::= foo"}, r"structured_outputs\.grammar: invalid grammar"),
])
def test_constraints_xgrammar_cannot_parse_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        check_spec(normalize_spec(spec))


def test_valid_constraints_parse():
    for spec in ({"json": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                 {"json_object": True}, {"regex": r"\d{3}-[a-z]+"},
                 {"choice": ["yes", "no"]}, {"grammar": 'root ::= "a" | "b" root'}):
        check_spec(normalize_spec(spec))


def test_choice_grammar_accepts_exactly_its_strings():
    from paternoster.structured_outputs import _choice_ebnf

    choices = ['say "hi"', "back\\slash", "tab\there", "ünïcode"]
    grammar = xgr.Grammar.from_ebnf(_choice_ebnf(choices))
    # xgrammar's own string matcher over a byte-level vocabulary-free grammar
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(grammar)
    for text in choices + ["say", "tab", "other"]:
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        accepted = matcher.accept_string(text) and matcher.is_terminated()
        assert accepted == (text in choices), text
