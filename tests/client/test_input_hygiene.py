"""Input hygiene (issue 37): one rule for tenant names over HTTP and ZeroMQ,
and chat content that OpenAI refuses refused here too, each a 400 (ZeroMQ:
``bad_request``) naming the field.

Tenant names: 1 to 256 printable characters (``str.isprintable``), no space at
either end; an empty one is the anonymous tenant on both transports. A name
with a control character never becomes a ``tenant`` label in /metrics.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from paternoster.client import BadRequestError, Client
from paternoster.entrypoints.openai.request_setup import TENANT_HEADER
from tests.metrics.utils import scrape, value

REQUESTS = "paternoster:tenant_requests_total"
PROMPT = {"prompt": "hi", "max_tokens": 2}
CHAT = "/v1/chat/completions"


def _post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    # json.dumps escapes control characters and lone surrogates, as a client's JSON would
    return httpx.post(server.http.url + path, content=json.dumps(body), timeout=30,
                      headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip


def _error(r: httpx.Response, param: str) -> dict:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError", error
    return error


def _wait_for_requests(url: str, tenant: str, expected: float, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if value(samples, REQUESTS, tenant=tenant) >= expected or time.monotonic() > deadline:
            assert value(samples, REQUESTS, tenant=tenant) == expected
            return samples
        time.sleep(0.05)


# ------------------------------------------------------------------ tenants


# Header values are Latin-1 bytes: 0x85 arrives as the C1 control character U+0085.
@pytest.mark.parametrize("bad", ["a\x07b", "a\x1b[2Jb", "a\x7fb", "a\x85b"])
def test_a_tenant_header_with_a_control_character_is_a_400_and_never_a_label(server, bad):
    headers = {TENANT_HEADER: bad.encode("latin-1")}
    r = _post(server, "/v1/completions", {**PROMPT, "user": "ok"}, headers)
    error = _error(r, TENANT_HEADER)
    assert error["message"].startswith(f"{TENANT_HEADER} must"), error
    text = httpx.get(server.http.url + "/metrics", timeout=5).text
    assert bad not in text and bad[1] not in text, "a control character reached /metrics"
    tenants = {dict(labels).get("tenant") for name, labels in scrape(server.http.url)
               if name == REQUESTS}  # fmt: skip
    assert all(t.isprintable() for t in tenants), tenants


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", PROMPT),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
])  # fmt: skip
def test_a_user_field_with_a_control_character_is_a_400_naming_user(server, path, body):
    error = _error(_post(server, path, {**body, "user": "x\ny"}), "user")
    assert error["message"] == "user must hold printable characters only, got U+000A at position 1"


def test_a_bad_user_is_refused_even_when_the_header_names_the_tenant(server):
    """The header wins, but a bad ``user`` beside it is refused, not dropped
    (a trial found ``"user": "a\\u0007"`` served with a good header)."""
    r = _post(server, "/v1/completions", {**PROMPT, "user": "a\x07"}, {TENANT_HEADER: "good"})
    assert _error(r, "user")["message"].startswith("user must hold printable characters")


def test_zmq_tenant_follows_the_same_rule_with_the_same_message(server):
    http = _error(_post(server, "/v1/completions", {**PROMPT, "user": "a\x07b"}), "user")
    with Client(server.address) as client:
        for bad in ("a\x07b", "t" * 257, " a", "a\u202eb"):
            with pytest.raises(BadRequestError) as e:
                client.generate("hi", tenant=bad, max_tokens=2)
            assert e.value.code == "bad_request" and e.value.param == "tenant", e.value
            assert e.value.message.startswith("tenant must"), e.value
            if bad == "a\x07b":
                assert e.value.message == http["message"].replace("user", "tenant", 1)


def test_an_empty_tenant_is_the_anonymous_tenant_on_both_transports(server):
    """OpenAI accepts ``user: ""``; ZeroMQ's ``tenant: ""`` is read alike
    (it was refused); an empty header leaves the body's ``user`` in force."""
    url = server.http.url
    before = value(scrape(url), REQUESTS, tenant="")
    assert _post(server, "/v1/completions", {**PROMPT, "user": ""}).status_code == 200
    assert _post(server, "/v1/completions", PROMPT, {TENANT_HEADER: ""}).status_code == 200
    with Client(server.address) as client:
        assert client.generate("hi", tenant="", max_tokens=2).finish_reason == "length"
    _wait_for_requests(url, "", before + 3)
    r = _post(server, "/v1/completions", {**PROMPT, "user": "hygiene-c"}, {TENANT_HEADER: ""})
    assert r.status_code == 200, r.text
    _wait_for_requests(url, "hygiene-c", 1)


# ------------------------------------------------------------- chat content


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([{"role": "user", "content": []}], "messages[0].content", "must not be an empty list"),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text"}]}],
     "messages[1].content[0].text", "a text part must carry text"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}],
     "messages[0].content[1].text", "is missing"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "messages[0].content[0].type", "only text content parts"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": "21 C"}],
     "messages[2].tool_call_id", "a 'tool' message must name the tool call it answers"),
    ([{"role": "user"}], "messages[0].content", "a 'user' message must have content"),
])  # fmt: skip
def test_chat_content_openai_refuses_is_a_400_naming_the_field(server, messages, param, words):
    for path in (CHAT, "/tokenize"):
        error = _error(_post(server, path, {"messages": messages, "max_tokens": 2}), param)
        assert error["message"].startswith(param) and words in error["message"], error


def test_a_tool_message_with_its_call_id_is_served(server):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21"}]},
    ]  # fmt: skip
    r = _post(server, CHAT, {"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("item", "param"), [
    ({"role": "user", "content": []}, "input[1].content"),
    ({"type": "function_call_output", "call_id": "call_1", "output": []}, "input[1].output"),
])  # fmt: skip
def test_responses_input_with_no_content_parts_is_a_400_naming_the_item(server, item, param):
    body = {"input": [{"role": "user", "content": "q"}, item], "max_output_tokens": 2}
    error = _error(_post(server, "/v1/responses", body), param)
    assert error["message"].startswith(f"{param} must not be an empty list"), error
