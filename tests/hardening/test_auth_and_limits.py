"""--api-key (Bearer) and the waiting-queue limits (503 with Retry-After)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from paternoster.entrypoints.cli import make_parser
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import EngineOverloadedError
from tests.hardening.conftest import fake_server

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def keyed(fake_model_dir):
    with fake_server(fake_model_dir, {}, "--api-key", KEY) as s:
        yield s


def test_api_key_is_required(keyed):
    body = {"prompt": "Hi", "max_tokens": 2}
    url = keyed.url + "/v1/completions"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "AuthenticationError"
    r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert httpx.get(keyed.url + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(keyed.url + "/health", timeout=10).status_code == 200  # probes stay open


def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("PATERNOSTER_API_KEY", "from-env")
    assert make_parser().parse_args(["serve"]).api_key == "from-env"
    assert make_parser().parse_args(["serve", "--api-key", "flag"]).api_key == "flag"
    monkeypatch.delenv("PATERNOSTER_API_KEY")
    assert make_parser().parse_args(["serve"]).api_key is None


def test_check_capacity_counts_requests_and_tokens():
    client = EngineClient(None, max_waiting_requests=2, max_waiting_tokens=100)
    client.check_capacity(5, 500).release()  # nothing waits: even a big request is admitted
    client.admission.start_waiting("a", 40, None)
    client.admission.start_waiting("b", 40, None)
    with pytest.raises(EngineOverloadedError, match="max-waiting-requests"):
        client.check_capacity(1, 1)
    client.admission.stop_waiting("b")
    client.check_capacity(1, 60).release()
    with pytest.raises(EngineOverloadedError, match="max-waiting-tokens"):
        client.check_capacity(1, 61)


@pytest.mark.parametrize("bad", [0, -1])
def test_limits_must_be_positive(bad):
    with pytest.raises(ValueError, match="max_waiting_requests"):
        EngineClient(None, max_waiting_requests=bad)


def test_full_queue_gives_503_at_once_and_queue_timeout_ends_waiters(fake_model_dir):
    # One request runs at a time (50 ms a step); two may wait, each for 1.5 s at most.
    opts = {"step_delay": 0.05, "max_running": 1}
    with fake_server(
        fake_model_dir, opts, "--max-waiting-requests", "2", "--queue-timeout", "1.5"
    ) as srv:  # fmt: skip
        url = srv.url + "/v1/completions"
        results: dict = {}

        def stream(name: str, max_tokens: int) -> None:
            body = {"prompt": "Hi", "max_tokens": max_tokens, "stream": True}
            with httpx.stream("POST", url, json=body, timeout=30) as r:
                results[name] = [line for line in r.iter_lines() if line]
                results[name + " status"] = r.status_code, r.headers.get("retry-after")

        runner = threading.Thread(target=stream, args=("runner", 60))  # 3 s of steps
        runner.start()
        srv.wait_for(lambda s: s["num_in_flight"] == 1 and s["num_waiting"] == 0, what="running")
        waiters = [threading.Thread(target=stream, args=(f"w{i}", 5)) for i in range(2)]
        for t in waiters:
            t.start()
        srv.wait_for(lambda s: s["num_waiting"] == 2, what="2 waiting")
        t0 = time.monotonic()
        r = httpx.post(url, json={"prompt": "Hi", "max_tokens": 2}, timeout=10)
        assert time.monotonic() - t0 < 1.0
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after") == "1"
        assert "max-waiting-requests" in r.json()["error"]["message"]
        for t in waiters:
            t.join(10)
        for name in ("w0", "w1"):  # timed out in the queue before any output: a 503
            assert results[name + " status"] == (503, "1"), results[name]
            error = json.loads("".join(results[name]))["error"]
            assert error["code"] == 503 and "queue" in error["message"], error
        runner.join(10)
        assert results["runner"][-1] == "data: [DONE]"
        assert '"error"' not in "".join(results["runner"])
        srv.wait_for(lambda s: s["num_in_flight"] == 0 and s["engine"]["num_running"] == 0
                     and s["engine"]["num_waiting"] == 0, what="idle")  # fmt: skip
