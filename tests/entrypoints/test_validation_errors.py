"""A body that fails validation is named by the path the client wrote
(``messages[0].content[0].text``), not by pydantic's union-member locations
(``messages.0.content.str``); trial findings of issue 37. The request models'
own errors are the input; the expected paths are read off each body."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from paternoster.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from paternoster.entrypoints.openai.responses_protocol import ResponsesRequest
from paternoster.entrypoints.openai.validation_errors import describe_errors, render_path

USER = {"role": "user", "content": "hi"}


def _describe(model, body: dict) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    return describe_errors(e.value.errors(), body)


@pytest.mark.parametrize(("model", "body", "param", "says"), [
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": ["hi"]}]},
     "messages[0].content[0]", "valid dictionary"),
    (ChatCompletionRequest,
     {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text", "valid string"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": {}}]},
     "messages[0].content", "valid string, or Input should be a valid list"),
    (ChatCompletionRequest,
     {"messages": [USER, {"role": "tool", "content": "x", "tool_call_id": 7}]},
     "messages[1].tool_call_id", "valid string"),
    (ChatCompletionRequest, {"messages": [{"content": "x"}]}, "messages[0].role", "Field required"),
    (ResponsesRequest, {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input[0].content[0].text", "Field required"),
    (ResponsesRequest, {"input": [{"type": "function_call_output", "output": "x"}]},
     "input[0].call_id", "Field required"),
    (ResponsesRequest, {"input": [{"role": "user"}]}, "input[0].content", "Field required"),
])  # fmt: skip
def test_an_item_error_names_the_path_into_the_body(model, body, param, says):
    text, got = _describe(model, body)
    assert got == param
    assert text.startswith(f"{param}: ") and says in text, text
    assert "str" not in text.split(":")[0] and "list[" not in text, text
    assert "more error" not in text  # the other union members are not errors of their own


def test_top_level_fields_keep_their_name_as_param_and_count_other_errors():
    text, param = _describe(CompletionRequest, {"prompt": "x", "max_tokens": "a",
                                                "temperature": "b"})  # fmt: skip
    assert param == "max_tokens" and text.startswith("max_tokens: ")
    assert text.endswith("(and 1 more error)")
    assert _describe(CompletionRequest, {}) == ("prompt: Field required", "prompt")


def test_without_a_body_pydantic_locations_are_kept():
    errors = [{"loc": ("body", "messages", 0, "role"), "msg": "Field required", "type": "missing"}]
    assert describe_errors(errors, None) == ("messages[0].role: Field required",
                                             "messages[0].role")  # fmt: skip


def test_render_path():
    assert render_path(["messages", 2, "content", 0, "text"]) == "messages[2].content[0].text"
    assert render_path([]) == ""
