"""HTTP behaviour that needs control over timing: a server over the scripted
fake engine (the real tokenizer, no model)."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from tests.entrypoints.utils import FAKE_ENGINE, start_server

MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def fake_server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_model")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    # Each step takes 20 ms, so a long request is still running a second later.
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": 0.02}))
    with start_server(
        str(d), "--engine-cls", FAKE_ENGINE, "--max-model-len", str(MAX_MODEL_LEN),
        "--num-kv-blocks", "64",
    ) as srv:  # fmt: skip
        yield srv


def _idle(stats: dict) -> bool:
    e = stats["engine"]
    return (
        stats["num_in_flight"] == 0
        and e.get("num_running") == 0
        and (e.get("num_free_blocks") == e.get("num_kv_blocks"))
    )


def test_omitted_max_tokens_fills_the_context_in_chat(fake_server, tokenizer):
    content = "Hello there " * 90
    body = {"messages": [{"role": "user", "content": content}], "ignore_eos": True}
    r = httpx.post(fake_server.url + "/v1/chat/completions", json=body, timeout=30).json()
    n = r["usage"]["prompt_tokens"]
    assert 150 < n < MAX_MODEL_LEN
    assert r["usage"]["completion_tokens"] == MAX_MODEL_LEN - n
    assert r["choices"][0]["finish_reason"] == "length"


def test_omitted_max_tokens_is_16_for_completions(fake_server, tokenizer):
    body = {"prompt": "Hello there", "ignore_eos": True}
    r = httpx.post(fake_server.url + "/v1/completions", json=body, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 16
    assert r["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"seed": 99999999999999999999999}, "seed"),
        ({"seed": 2**63 - 1, "n": 2}, "seed"),
        ({"priority": -99999999999999999999999}, "priority"),
        ({"stop": ["\ud800"]}, "stop"),
        ({"prompt": "\ud800"}, "prompt"),
        ({"n": 100000}, "n"),
    ],
    ids=["huge-seed", "seed-plus-n", "huge-priority", "surrogate-stop", "surrogate-prompt",
         "huge-n"],
)  # fmt: skip
def test_unencodable_values_get_400_and_the_server_keeps_serving(fake_server, body, param):
    # json.dumps escapes lone surrogates as \\udXXX, as a client's JSON would.
    r = httpx.post(
        fake_server.url + "/v1/completions",
        content=json.dumps({"prompt": "hi", "max_tokens": 2, **body}),
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    ok = httpx.post(
        fake_server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10
    )
    assert ok.status_code == 200


def test_a_json_body_sent_without_the_json_content_type_is_a_400_naming_the_header(
        fake_server):
    # curl -d sends application/x-www-form-urlencoded unless told otherwise.
    body = json.dumps({"prompt": "hi", "max_tokens": 2})
    r = httpx.post(fake_server.url + "/v1/completions", content=body, timeout=10,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == (
        "The request body must be JSON, sent with the header Content-Type: application/json "
        "(got Content-Type: application/x-www-form-urlencoded)")
    # application/*+json is JSON too.
    ok = httpx.post(fake_server.url + "/v1/completions", content=body, timeout=10,
                    headers={"content-type": "application/vnd.api+json"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_an_empty_body_is_a_400_saying_so(fake_server, path):
    r = httpx.post(fake_server.url + path, content=b"", timeout=10,
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "The request body is empty: send a JSON object"


def test_surrogate_in_chat_content_is_400(fake_server):
    body = {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2}
    r = httpx.post(
        fake_server.url + "/v1/chat/completions",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_sse_format(fake_server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "n": 2, "stream_options": {"include_usage": True}}  # fmt: skip
    r = httpx.post(fake_server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    role = {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [role, role]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    finished = sorted(ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"])
    assert finished == [0, 1]


def test_disconnect_mid_stream_aborts(fake_server):
    body = {"prompt": "story", "stream": True, "ignore_eos": True}
    with httpx.stream("POST", fake_server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    fake_server.wait_for(_idle, timeout=2, what="abort after a streaming disconnect")


def test_disconnect_non_streaming_aborts(fake_server):
    body = {"prompt": "story", "ignore_eos": True, "max_tokens": MAX_MODEL_LEN - 8}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(fake_server.url + "/v1/completions", json=body, timeout=1.0)
    fake_server.wait_for(_idle, timeout=2, what="abort after a non-streaming disconnect")


def test_unknown_fields_and_user_are_ignored(fake_server):
    body = {"prompt": "hi", "max_tokens": 2, "user": "u-1", "frequency_penalty": 0.0,
            "logit_bias": {}, "some_future_field": [1, 2]}  # fmt: skip
    r = httpx.post(fake_server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
