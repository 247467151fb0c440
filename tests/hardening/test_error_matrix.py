"""Every row of the error matrix (docs/errors.md) for both generation
endpoints: the status, the OpenAI error shape and the parameter named."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.hardening.conftest import MAX_MODEL_LEN, fake_server

MAX_N = 8
MAX_STOP = 4
BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def srv(fake_model_dir):
    with fake_server(
        fake_model_dir, {"step_delay": 0.001},
        "--max-n", str(MAX_N), "--max-stop-sequences", str(MAX_STOP),
        "--max-request-body-bytes", str(BODY_LIMIT),
    ) as s:  # fmt: skip
        yield s


def _post(srv, path: str, content: bytes | str, **headers) -> httpx.Response:
    headers = {"content-type": "application/json", **headers}
    return httpx.post(srv.url + path, content=content, headers=headers, timeout=30)


def _assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["code"] == status and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


COMPLETION = {"prompt": "Hello", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
ENDPOINTS = [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]

OPTS = "stream_options"
# (name, fields merged into the valid body, expected status, expected param)
ROWS = [
    ("wrong-type-max-tokens", {"max_tokens": "5"}, 400, "max_tokens"),
    ("wrong-type-stream", {"stream": "yes"}, 400, "stream"),
    ("int-as-bool", {"stream": 1}, 400, "stream"),
    ("wrong-type-temperature", {"temperature": "hot"}, 400, "temperature"),
    ("nan-temperature", {"temperature": float("nan")}, 400, "temperature"),
    ("inf-temperature", {"temperature": float("inf")}, 400, "temperature"),
    ("negative-temperature", {"temperature": -0.5}, 400, "temperature"),
    ("top-p-zero", {"top_p": 0.0}, 400, "top_p"),
    ("top-p-above-one", {"top_p": 1.5}, 400, "top_p"),
    ("top-k-below-minus-one", {"top_k": -2}, 400, "top_k"),
    ("n-zero", {"n": 0}, 400, "n"),
    ("n-above-max", {"n": MAX_N + 1}, 400, "n"),
    ("max-tokens-zero", {"max_tokens": 0}, 400, "max_tokens"),
    ("max-tokens-above-context", {"max_tokens": MAX_MODEL_LEN + 1}, 400, "max_tokens"),
    ("too-many-stops", {"stop": [f"s{i}" for i in range(MAX_STOP + 1)]}, 400, "stop"),
    ("logprobs-negative", {"logprobs": -1}, 400, "logprobs"),
    ("stream-options-no-stream", {"stream_options": {"include_usage": True}}, 400, OPTS),
    ("stream-options-stream-false", {"stream": False, "stream_options": {}}, 400, OPTS),
    ("unknown-model", {"model": "no-such-model"}, 404, "model"),
]


@pytest.mark.parametrize(("path", "valid"), ENDPOINTS, ids=["completions", "chat"])
@pytest.mark.parametrize(("name", "fields", "status", "param"), ROWS, ids=[r[0] for r in ROWS])
def test_error_row(srv, path, valid, name, fields, status, param):
    # json.dumps writes NaN/Infinity tokens, which Python's JSON parser accepts.
    r = _post(srv, path, json.dumps({**valid, **fields}))
    _assert_error(r, status, param)


@pytest.mark.parametrize(("path", "valid"), ENDPOINTS, ids=["completions", "chat"])
def test_stream_options_need_stream_true(srv, path, valid):
    body = {**valid, "stream_options": {"include_usage": True}}
    err = _assert_error(_post(srv, path, json.dumps(body)), 400, "stream_options")
    assert "Stream options can only be defined when `stream=True`." in err["message"]  # vLLM's
    r = _post(srv, path, json.dumps({**body, "stream": True}))
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n"), r.text
    r = _post(srv, path, json.dumps({**valid, "stream_options": None}))  # null is no options
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "valid"), ENDPOINTS, ids=["completions", "chat"])
def test_unknown_fields_are_ignored(srv, path, valid):
    r = _post(srv, path, json.dumps({**valid, "frobnicate": True, "metadata": {"a": 1}}))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("path", "valid"), ENDPOINTS, ids=["completions", "chat"])
def test_malformed_json(srv, path, valid):
    _assert_error(_post(srv, path, '{"prompt": "Hello",'), 400)
    _assert_error(_post(srv, path, "[1, 2]"), 400)


@pytest.mark.parametrize(("path", "valid"), ENDPOINTS, ids=["completions", "chat"])
def test_invalid_utf8_body(srv, path, valid):
    _assert_error(_post(srv, path, b'{"prompt": "\xff\xfe", "messages": []}'), 400)


@pytest.mark.parametrize(
    ("path", "param"), [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")]
)
def test_missing_required_field(srv, path, param):
    _assert_error(_post(srv, path, json.dumps({"max_tokens": 2})), 400, param)


def test_empty_prompt(srv):
    for prompt in ("", [], [[]]):
        body = {"prompt": prompt, "max_tokens": 2}
        _assert_error(_post(srv, "/v1/completions", json.dumps(body)), 400, "prompt")


def test_empty_messages_and_unknown_role(srv):
    _assert_error(_post(srv, "/v1/chat/completions", json.dumps({"messages": []})), 400, "messages")
    body = {"messages": [{"role": "wizard", "content": "hi"}]}  # OpenAI names the path too
    _assert_error(_post(srv, "/v1/chat/completions", json.dumps(body)), 400, "messages[0].role")


def test_prompt_over_context_names_both_lengths(srv):
    prompt = list(range(1, MAX_MODEL_LEN + 11))
    body = {"prompt": prompt, "max_tokens": 1}
    err = _assert_error(_post(srv, "/v1/completions", json.dumps(body)), 400)
    assert str(MAX_MODEL_LEN) in err["message"] and str(MAX_MODEL_LEN + 10) in err["message"]
    body = {"prompt": prompt}  # no max_tokens: still refused, never truncated
    err = _assert_error(_post(srv, "/v1/completions", json.dumps(body)), 400, "prompt")
    assert str(MAX_MODEL_LEN) in err["message"] and str(MAX_MODEL_LEN + 10) in err["message"]


def test_chat_prompt_over_context_names_both_lengths(srv, tokenizer):
    messages = [{"role": "user", "content": "lift " * MAX_MODEL_LEN}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_len = len(tokenizer(text, add_special_tokens=False).input_ids)
    assert prompt_len > MAX_MODEL_LEN
    # The prompt alone is over the context: the chat's prompt field is messages.
    for extra, param in (({"max_tokens": 1}, "messages"), ({}, "messages")):
        body = {"messages": messages, **extra}
        err = _assert_error(_post(srv, "/v1/chat/completions", json.dumps(body)), 400, param)
        assert str(MAX_MODEL_LEN) in err["message"] and str(prompt_len) in err["message"], err


def test_logprobs_out_of_range(srv):
    body = {**COMPLETION, "logprobs": 21}
    _assert_error(_post(srv, "/v1/completions", json.dumps(body)), 400, "logprobs")
    body = {**CHAT, "logprobs": True, "top_logprobs": 21}
    _assert_error(_post(srv, "/v1/chat/completions", json.dumps(body)), 400, "top_logprobs")


def test_oversized_body_is_413(srv):
    big = json.dumps({"prompt": "x" * (BODY_LIMIT + 1), "max_tokens": 1})
    _assert_error(_post(srv, "/v1/completions", big), 413)

    def chunks():  # no Content-Length: refused while it arrives
        for _ in range(BODY_LIMIT // 1024 + 2):
            yield b" " * 1024

    r = httpx.post(srv.url + "/v1/completions", content=chunks(), timeout=30,
                   headers={"content-type": "application/json"})  # fmt: skip
    _assert_error(r, 413)


def test_routing_errors_have_the_openai_shape(srv):
    _assert_error(httpx.get(srv.url + "/v1/nothing-here", timeout=10), 404)
    _assert_error(httpx.get(srv.url + "/v1/completions", timeout=10), 405)


def test_server_still_serves_after_the_matrix(srv):
    r = _post(srv, "/v1/completions", json.dumps(COMPLETION))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
