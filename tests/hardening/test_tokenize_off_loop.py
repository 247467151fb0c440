"""Tokenizing a very long prompt runs off the event loop: other streams keep
flowing meanwhile, and the long prompt gets its 400 (over the context)."""

from __future__ import annotations

import threading
import time

import httpx

from tests.hardening.conftest import fake_server


def test_long_prompt_does_not_stall_other_streams(fake_model_dir):
    with fake_server(fake_model_dir, {"step_delay": 0.02}) as srv:
        times: list[float] = []

        def stream() -> None:
            body = {"prompt": "Hi", "max_tokens": 200, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        times.append(time.monotonic())

        t = threading.Thread(target=stream)
        t.start()
        srv.wait_for(lambda s: s["engine"].get("num_running") == 1, what="running")
        huge = {"prompt": "Hello world, this is a long prompt. " * 60000, "max_tokens": 1}
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json=huge, timeout=60)
        t1 = time.monotonic()
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        t.join(30)
        # Gaps between stream events that overlap the long request.
        during = [b - a for a, b in zip(times, times[1:]) if a < t1 and b > t0]
        assert t1 - t0 > 0.5 and during, "the long prompt was tokenized too fast to tell"
        assert max(during) < 0.4, max(during)
