"""Killing the engine process of a running server (real default model): in-flight
requests end with an error within 2 s and /health turns 503 with the reason."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.entrypoints.utils import start_server


@pytest.fixture(scope="module")
def doomed_server(default_model_path):
    with start_server(
        str(default_model_path), "--num-kv-blocks", "256", "--max-model-len", "2048"
    ) as srv:
        yield srv


def test_killed_engine_fails_requests_fast_and_health_is_503(doomed_server):
    srv = doomed_server
    results: dict = {}

    def stream():
        body = {"prompt": "Write a long essay.", "max_tokens": 1500, "stream": True,
                "ignore_eos": True}  # fmt: skip
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as r:
            results["events"] = [line for line in r.iter_lines() if line]
            results["stream_done"] = time.monotonic()

    def blocking():
        body = {"prompt": "Write another long essay.", "max_tokens": 1500, "ignore_eos": True}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        results["blocking"] = r
        results["blocking_done"] = time.monotonic()

    threads = [threading.Thread(target=stream), threading.Thread(target=blocking)]
    for t in threads:
        t.start()
    srv.wait_for(lambda s: s["engine"].get("num_running", 0) == 2, timeout=30, what="2 running")
    os.kill(srv.engine_pid(), signal.SIGKILL)
    killed = time.monotonic()
    for t in threads:
        t.join(10)
    assert results["stream_done"] - killed < 2.0
    assert results["blocking_done"] - killed < 2.0
    errors = [e for e in results["events"] if '"error"' in e]
    assert errors and "engine" in errors[0]
    assert results["events"][-1] == "data: [DONE]"
    r = results["blocking"]
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"
    health = srv.get("/health")
    assert health.status_code == 503 and "exited" in health.json()["reason"]
    late = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi"}, timeout=10)
    assert late.status_code == 503
