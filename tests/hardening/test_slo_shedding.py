"""The slo policy behind the HTTP server: per-request targets from the body
and from priority classes, load shedding as a 503 in OpenAI's error shape,
and 400s for bad target fields. The engine is the real EngineCore over the
cost-model runner (tests/hardening/cost_model_engine.py): no model."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.utils import start_server

ENGINE = "tests.hardening.cost_model_engine:CostModelEngineCore"
# Priority 1's TTFT target (1 ms) is below any step the cost model predicts
# (46 ms of overhead): with load shedding, such requests are refused at once.
CONFIG = {"ttft_s": 30.0, "itl_s": 5.0, "load_shedding": True,
          "classes": {"1": {"ttft_s": 0.001}}}  # fmt: skip


@pytest.fixture(scope="module")
def slo_server(fake_model_dir):
    with start_server(
        str(fake_model_dir), "--engine-cls", ENGINE, "--scheduler", "slo",
        "--scheduler-config", json.dumps(CONFIG), "--max-model-len", "2048",
        "--num-kv-blocks", "512",
    ) as srv:  # fmt: skip
        yield srv


def post(srv, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(srv.url + path, json={"prompt": "Hello there", "max_tokens": 4,
                                            "ignore_eos": True, **body}, timeout=60)  # fmt: skip


def assert_shed(error: dict) -> None:
    assert error["code"] == 503 and error["type"] == "ServiceUnavailableError", error
    assert "TTFT target" in error["message"]


def test_a_request_that_can_make_its_target_is_served(slo_server):
    r = post(slo_server, {})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_an_impossible_explicit_target_is_shed_with_503(slo_server):
    r = post(slo_server, {"slo_ttft_s": 0.001})
    assert r.status_code == 503, r.text
    assert r.headers.get("retry-after") == "1"
    assert_shed(r.json()["error"])
    chat = {"messages": [{"role": "user", "content": "hi"}], "slo_ttft_s": 0.001}
    r = httpx.post(slo_server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == 503


def test_the_priority_class_target_applies_and_an_explicit_field_overrides_it(slo_server):
    assert post(slo_server, {"priority": 1}).status_code == 503
    assert post(slo_server, {"priority": 1, "slo_ttft_s": 30}).status_code == 200
    assert post(slo_server, {"priority": 0}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/responses"])
def test_a_shed_stream_is_a_503_before_any_event(slo_server, path):
    """Refused before any output: the stream's status is still free, so the
    client sees 503 with Retry-After (and OpenAI's clients retry it) rather
    than 200 and an error event."""
    inputs = {"/v1/completions": {"prompt": "Hello", "max_tokens": 4},
              "/v1/responses": {"input": "Hello", "max_output_tokens": 4},
              "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello"}],
                                       "max_tokens": 4}}  # fmt: skip
    body = {**inputs[path], "stream": True, "slo_ttft_s": 0.001}
    with httpx.stream("POST", slo_server.url + path, json=body, timeout=60) as r:
        body = r.read()
    assert r.status_code == 503 and r.headers.get("retry-after") == "1", body
    assert_shed(json.loads(body)["error"])


def test_a_served_stream_still_streams(slo_server):
    with httpx.stream("POST", slo_server.url + "/v1/completions", timeout=60, json={
        "prompt": "Hello", "max_tokens": 4, "stream": True, "ignore_eos": True,
    }) as r:  # fmt: skip
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("field", "value"), [
    ("slo_ttft_s", 0), ("slo_ttft_s", -1.5), ("slo_ttft_s", "fast"),
    ("slo_itl_s", 0), ("slo_itl_s", [0.1]),
])  # fmt: skip
def test_bad_target_fields_are_a_400_naming_them(slo_server, field, value):
    r = post(slo_server, {field: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == 400, error
