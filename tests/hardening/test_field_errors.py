"""Fields added with the request pipeline refuse bad values with a 400 that
names them (found by a fresh user's trial)."""

from __future__ import annotations

import json

import httpx
import pytest

from paternoster.client._common import generate_message
from tests.hardening.conftest import MAX_MODEL_LEN, fake_server

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def srv(fake_model_dir):
    with fake_server(fake_model_dir, {}) as s:
        yield s


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/v1/completions", {"prompt": "x", "cache_salt": ""}, "cache_salt", "non-empty"),
    ("/v1/completions", {"prompt": "x", "cache_salt": "\ud800"}, "cache_salt", "Unicode"),
    ("/v1/completions", {"prompt": "x", "bad_words": ["\ud800"]}, "bad_words", "Unicode"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": [-1]}, "allowed_token_ids",
     ">= 0"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": MAX_MODEL_LEN},
     "max_completion_tokens", "maximum context length"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1},
     "max_completion_tokens", "max_completion_tokens must be"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -1},
     "max_output_tokens", "max_output_tokens must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a " * MAX_MODEL_LEN}],
                              "max_tokens": 1}, "messages", "in the prompt"),
    ("/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN + 1), "max_tokens": 1}, "prompt",
     "in the prompt"),
])  # fmt: skip
def test_bad_field_is_a_400_naming_it(srv, path, body, param, words):
    r = httpx.post(srv.url + path, content=json.dumps(body),  # ASCII: "\ud800" escaped
                   headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_python_client_sends_cache_salt_as_a_request_field():
    _, msg = generate_message("hi", None, "r", False, 0, True,
                              {"cache_salt": "tenant", "max_tokens": 2})  # fmt: skip
    assert msg["cache_salt"] == "tenant" and msg["sampling"] == {"max_tokens": 2}
