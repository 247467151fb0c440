"""The one validation of every limit (InputProcessor), against the tokenizer and
the OpenAI rules it implements."""

from __future__ import annotations

import pytest

from paternoster.frontend.errors import InvalidRequestError
from paternoster.frontend.processor import (
    MAX_TENANT_LENGTH,
    ChatInput,
    InputProcessor,
    check_tenant,
    wire_tenant,
)

MAX_LEN = 64


@pytest.fixture
def processor(tokenizer):
    return InputProcessor(tokenizer, len(tokenizer), MAX_LEN, max_n=4, max_stop=2)


def _param(excinfo) -> str | None:
    return excinfo.value.param


def test_default_max_tokens_is_capped_by_the_room_the_prompt_leaves(processor):
    assert processor.sampling_params({}, [10], default_max_tokens=16).max_tokens == 16
    assert processor.sampling_params({}, [60], default_max_tokens=16).max_tokens == 4
    assert processor.sampling_params({}, [10]).max_tokens == MAX_LEN - 10  # chat: all the room
    assert processor.sampling_params({}, [10, 50], default_max_tokens=16).max_tokens == 14


def test_a_prompt_that_fills_the_context_names_the_prompt(processor):
    with pytest.raises(InvalidRequestError, match=f"maximum context length is {MAX_LEN}") as e:
        processor.sampling_params({}, [MAX_LEN], default_max_tokens=16)
    assert _param(e) == "prompt"


def test_prompt_plus_max_tokens_over_the_context_names_both_lengths(processor):
    with pytest.raises(InvalidRequestError, match="60 in the prompt, 10 for the completion") as e:
        processor.sampling_params({"max_tokens": 10}, [60])
    assert _param(e) == "max_tokens"


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 5}, "n"),
    ({"stop": ["a", "b", "c"]}, "stop"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"logprobs": 21}, "logprobs"),
    ({"stop_token_ids": [10**9]}, "stop_token_ids"),
    ({"logit_bias": {10**9: 1.0}}, "logit_bias"),
    ({"min_tokens": 30, "max_tokens": 20}, "min_tokens"),
])  # fmt: skip
def test_out_of_range_fields_are_named(processor, fields, param):
    with pytest.raises(InvalidRequestError) as e:
        processor.sampling_params(fields, [5], default_max_tokens=16)
    assert _param(e) == param


def test_one_stop_string_becomes_a_list(processor):
    assert processor.sampling_params({"stop": "\n"}, [5], 16).stop == ["\n"]


def test_token_ids_outside_the_vocabulary_are_refused(processor, tokenizer):
    with pytest.raises(InvalidRequestError, match="out of range") as e:
        processor.prompt([1, len(tokenizer)], param="prompt_token_ids")
    assert _param(e) == "prompt_token_ids"
    with pytest.raises(InvalidRequestError, match="must not be empty"):
        processor.prompt([])


def test_text_prompt_matches_the_tokenizer(processor, tokenizer):
    assert processor.prompt("Hello there") == tokenizer("Hello there").input_ids
    with pytest.raises(InvalidRequestError, match="not valid Unicode"):
        processor.prompt("bad \udc80 text")


def test_a_user_message_without_content_is_refused(processor):
    """OpenAI answers 400; before, it generated to the end of the context."""
    with pytest.raises(InvalidRequestError, match="'user' message must have content") as e:
        processor.chat(ChatInput([{"role": "user", "content": None}]))
    assert _param(e) == "messages[0].content"  # the field's path, as OpenAI names it


def test_an_assistant_message_may_have_no_content(processor, tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "Again"}]  # fmt: skip
    text, ids = processor.chat(ChatInput(messages))
    expected = [{**m, "content": m["content"] or ""} for m in messages]
    assert text == tokenizer.apply_chat_template(expected, add_generation_prompt=True,
                                                 tokenize=False)  # fmt: skip
    assert ids == tokenizer(text, add_special_tokens=False).input_ids


def test_fit_fills_max_tokens_none_with_the_room(processor):
    from paternoster.sampling_params import SamplingParams

    assert processor.fit(SamplingParams(max_tokens=None), 24).max_tokens == MAX_LEN - 24
    with pytest.raises(InvalidRequestError):
        processor.fit(SamplingParams(max_tokens=50), 24)


def test_a_prompt_alone_over_the_context_names_the_prompt_field(processor):
    for param in ("prompt", "messages"):
        with pytest.raises(InvalidRequestError, match=f"{MAX_LEN + 5} in the prompt") as e:
            processor.sampling_params({"max_tokens": 1}, [MAX_LEN + 5], prompt_param=param)
        assert _param(e) == param


def test_a_tool_message_without_content_is_refused(processor):
    with pytest.raises(InvalidRequestError, match="'tool' message must have content"):
        processor.chat(ChatInput([{"role": "user", "content": "x"}, {"role": "tool"}]))


# ---------------------------------------------------------------- tenant names


@pytest.mark.parametrize("name", ["acme", "team 7", "x" * MAX_TENANT_LENGTH, "équipe-東京",
                                  "a:b/c@d", "🙂"])  # fmt: skip
def test_a_printable_tenant_name_is_kept(name):
    assert check_tenant(name, "user") == name
    assert wire_tenant(name, "user") == name


@pytest.mark.parametrize(("name", "words"), [
    ("a\x07b", "printable characters only, got U+0007 at position 1"),
    ("a\x1b[31mred", "U+001B"),  # a terminal escape, as in a log line
    ("tab\there", "U+0009"),
    ("a\nb", "U+000A"),
    ("a\x7fb", "U+007F"),  # DEL
    ("a\x85b", "U+0085"),  # C1 NEL: what a raw header byte 0x85 becomes (Latin-1)
    ("a\u200bb", "U+200B"),  # zero width space: two tenants that look alike
    ("\u202eevil", "U+202E"),  # right-to-left override
    ("a\u00a0b", "U+00A0"),  # no-break space: the only space allowed is the ASCII one
    ("\ud800", "U+D800"),  # a lone surrogate (not valid Unicode)
    (" lead", "must not begin or end with a space"),
    ("trail ", "must not begin or end with a space"),
    (" ", "must not begin or end with a space"),
    ("t" * (MAX_TENANT_LENGTH + 1), f"at most {MAX_TENANT_LENGTH} characters"),
])  # fmt: skip
def test_a_tenant_name_with_unprintable_characters_is_refused_naming_the_field(name, words):
    for param in ("user", "X-Tenant-Id", "tenant"):
        with pytest.raises(InvalidRequestError, match=f"^{param} must") as e:
            wire_tenant(name, param)
        assert words in str(e.value) and _param(e) == param
        assert name not in str(e.value) or name.isprintable()  # the character is not echoed


def test_an_empty_tenant_is_anonymous_on_the_wire_and_refused_as_a_name():
    """HTTP and ZeroMQ read "" as no tenant (OpenAI accepts ``user: ""``); the
    offline API and traces, which have ``None`` for that, refuse it."""
    assert wire_tenant("", "tenant") is None and wire_tenant(None, "user") is None
    with pytest.raises(InvalidRequestError, match="tenant must be a non-empty string"):
        check_tenant("", "tenant")
    with pytest.raises(InvalidRequestError, match="tenant must be a non-empty string"):
        check_tenant(7, "tenant")
