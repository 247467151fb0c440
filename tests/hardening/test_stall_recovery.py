"""A stopped engine process is reported within the stall timeout, and healthy
again once it resumes (orchestrators' readiness); a long step is no stall."""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.hardening.conftest import fake_server

STALL_S = 1.0


def _poll(url: str, want: int, within: float) -> tuple[float, httpx.Response]:
    """Seconds until GET /health answers ``want``, and that response."""
    start = time.monotonic()
    while True:
        r = httpx.get(url + "/health", timeout=5)
        if r.status_code == want:
            return time.monotonic() - start, r
        assert time.monotonic() - start < within, (r.status_code, r.text)
        time.sleep(0.05)


def test_a_stopped_engine_is_unhealthy_within_the_stall_timeout_and_recovers(fake_model_dir):
    with fake_server(fake_model_dir, {}, "--engine-stall-timeout", str(STALL_S)) as srv:
        pid = srv.get("/stats").json()["engine_pid"]
        assert httpx.get(srv.url + "/health").status_code == 200
        os.kill(pid, signal.SIGSTOP)
        try:
            took, r = _poll(srv.url, 503, within=STALL_S + 3)
            assert took < STALL_S + 1.5
            assert r.json()["status"] == "unhealthy" and "stalled" in r.json()["reason"]
            refused = httpx.post(srv.url + "/v1/completions",
                                 json={"prompt": [1, 2], "max_tokens": 2}, timeout=10)  # fmt: skip
            assert refused.status_code == 503 and "stalled" in refused.json()["error"]["message"]
        finally:
            os.kill(pid, signal.SIGCONT)
        _poll(srv.url, 200, within=3)
        ok = httpx.post(srv.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2},
                        timeout=10)  # fmt: skip
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert srv.get("/stats").json()["engine_pid"] == pid  # the same process, not a restart


def test_a_step_longer_than_the_stall_timeout_stays_healthy(fake_model_dir):
    """The engine beats from its own thread: a 2.5 s step under a 1 s stall
    timeout keeps /health at 200 throughout."""
    opts = {"step_delay": 2.5}
    with fake_server(fake_model_dir, opts, "--engine-stall-timeout", str(STALL_S)) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            import threading

            result = {}
            worker = threading.Thread(target=lambda: result.update(r=http.post(
                "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})))  # fmt: skip
            worker.start()
            codes = set()
            while worker.is_alive():
                codes.add(httpx.get(srv.url + "/health", timeout=5).status_code)
                time.sleep(0.1)
            worker.join()
        assert codes == {200}
        assert result["r"].status_code == 200
