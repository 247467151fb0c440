"""GET /metrics over the scripted fake engine: the counts add up."""

from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

from tests.entrypoints.utils import FAKE_ENGINE, start_server
from tests.metrics.utils import delta, scrape, value

P = "paternoster:"


@pytest.fixture(scope="module")
def fake_server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_model_metrics")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": 0.02}))
    with start_server(
        str(d), "--engine-cls", FAKE_ENGINE, "--max-model-len", "256", "--num-kv-blocks", "64"
    ) as srv:
        yield srv


def _complete(url: str, **body) -> dict:
    body = {"ignore_eos": True, **body}
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    r.raise_for_status()
    return r.json()


def _wait_idle(url: str) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        samples = scrape(url)
        if value(samples, P + "num_requests_running", engine="0") == 0:
            return samples
        time.sleep(0.1)
    raise AssertionError("engine did not go idle")


def test_metrics_endpoint_lists_every_metric(fake_server):
    r = httpx.get(fake_server.url + "/metrics", timeout=5)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    names = {name for name, _ in scrape(fake_server.url)}
    for name in (
        "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
        "state_slot_usage_perc", "num_preemptions_total", "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total", "time_to_first_token_seconds_count",
        "inter_token_latency_seconds_count", "e2e_request_latency_seconds_count",
        "request_queue_time_seconds_count", "iteration_tokens_total_count",
    ):  # fmt: skip
        assert P + name in names


def test_counts_add_up_after_a_known_workload(fake_server):
    url = fake_server.url
    before = _wait_idle(url)
    responses = [
        _complete(url, prompt=[11, 12, 13], max_tokens=5),
        _complete(url, prompt=[21, 22, 23, 24, 25], max_tokens=3),
        _complete(url, prompt=[31, 32], max_tokens=8, stop_token_ids=[1002]),  # stops at 3
    ]
    chat = httpx.post(
        url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
              "ignore_eos": True},
        timeout=30,
    ).json()  # fmt: skip
    responses.append(chat)
    after = _wait_idle(url)

    usages = [r["usage"] for r in responses]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    reasons = [r["choices"][0]["finish_reason"] for r in responses]
    assert reasons == ["length", "length", "stop", "length"]
    n = len(responses)

    assert delta(after, before, P + "generation_tokens_total") == completion
    assert delta(after, before, P + "prompt_tokens_total") == prompt
    reason = P + "request_success_total"
    assert delta(after, before, reason, finished_reason="length") == 3
    assert delta(after, before, reason, finished_reason="stop") == 1
    assert delta(after, before, reason, finished_reason="abort") == 0
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds"):  # fmt: skip
        assert delta(after, before, P + hist + "_count") == n, hist
    # One inter-token interval per token after each request's first.
    assert delta(after, before, P + "inter_token_latency_seconds_count") == completion - n
    # The fake computes each prompt once, then every token but the last.
    steps_tokens = delta(after, before, P + "iteration_tokens_total_sum", engine="0")
    assert steps_tokens == prompt + completion - n
    assert delta(after, before, P + "iteration_tokens_total_count", engine="0") >= max(
        u["completion_tokens"] for u in usages
    )
    assert value(after, P + "kv_cache_usage_perc", engine="0") == 0
    assert value(after, P + "num_requests_waiting", engine="0") == 0


def test_n_choices_count_one_request_and_the_prompt_once(fake_server):
    """vLLM counts API requests: n=3 is one request, its prompt counted once,
    every choice's tokens generated."""
    url = fake_server.url
    before = _wait_idle(url)
    r = _complete(url, prompt=[5, 6, 7, 8], max_tokens=2, n=3)
    after = _wait_idle(url)
    assert r["usage"]["completion_tokens"] == 3 * 2
    assert delta(after, before, P + "prompt_tokens_total") == 4
    assert delta(after, before, P + "generation_tokens_total") == 3 * 2
    assert delta(after, before, P + "request_success_total", finished_reason="length") == 1
    assert delta(after, before, P + "e2e_request_latency_seconds_count") == 1
    assert delta(after, before, P + "time_to_first_token_seconds_count") == 1


def test_several_prompts_are_one_request(fake_server):
    url = fake_server.url
    before = _wait_idle(url)
    _complete(url, prompt=[[5, 6, 7], [8, 9]], max_tokens=2)
    after = _wait_idle(url)
    assert delta(after, before, P + "prompt_tokens_total") == 5
    assert delta(after, before, P + "request_success_total", finished_reason="length") == 1


def test_running_gauge_sees_a_live_request(fake_server):
    url = fake_server.url
    with httpx.stream(
        "POST", url + "/v1/completions",
        json={"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": True, "stream": True},
        timeout=30,
    ) as resp:  # fmt: skip
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        deadline = time.monotonic() + 5
        seen = 0.0
        while time.monotonic() < deadline and seen < 1:
            samples = scrape(url)
            seen = value(samples, P + "num_requests_running", engine="0")
            time.sleep(0.1)
        assert seen == 1
        assert value(samples, P + "kv_cache_usage_perc", engine="0") > 0
        for _ in lines:
            pass
    _wait_idle(url)


def test_client_disconnect_counts_as_abort(fake_server):
    url = fake_server.url
    before = _wait_idle(url)
    prompt = [7] * 10
    received = 0
    with httpx.stream(
        "POST", url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 200, "ignore_eos": True, "stream": True},
        timeout=30,
    ) as resp:  # fmt: skip
        for line in resp.iter_lines():
            if line.startswith("data:"):
                received += 1
            if received == 5:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    after = scrape(url)
    reason = P + "request_success_total"
    while delta(after, before, reason, finished_reason="abort") < 1:
        assert time.monotonic() < deadline, "abort not counted"
        time.sleep(0.1)
        after = scrape(url)
    after = _wait_idle(url)
    assert delta(after, before, reason, finished_reason="abort") == 1
    assert delta(after, before, reason, finished_reason="length") == 0
    assert delta(after, before, P + "e2e_request_latency_seconds_count") == 1
    assert delta(after, before, P + "prompt_tokens_total") == len(prompt)
    generated = delta(after, before, P + "generation_tokens_total")
    assert received <= generated < 200
    assert delta(after, before, P + "inter_token_latency_seconds_count") == generated - 1


def test_each_app_has_its_own_registry():
    from paternoster.metrics.server import ServerMetrics

    a, b = ServerMetrics(list), ServerMetrics(lambda: [{"num_running": 3}])
    a.requests.track(5).finish("stop", 2)
    assert b"paternoster:generation_tokens_total 0.0" in b.render()
    assert b'paternoster:num_requests_running{engine="0"} 3.0' in b.render()
    assert b"paternoster:generation_tokens_total 2.0" in a.render()
