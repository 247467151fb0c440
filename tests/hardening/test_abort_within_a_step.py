"""A client that disconnects (streaming or not, either endpoint) has its request
aborted in the engine within one step: counted in engine steps, not seconds.

The fake engine takes ``STEP_S`` per step and logs every step (start, end, the
requests that got a token) and every abort (tests/hardening/fake_engine.py).
The client is a raw socket, so the moment it closes is known exactly. After
the close at most one step that began later may still compute the request
(one that began while the abort was on its way); the engine then drops it
before its next step, counts it in ``request_success_total{finished_reason=
"abort"}`` and frees its blocks.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import pytest

from tests.hardening.conftest import fake_server
from tests.metrics.utils import delta, scrape

STEP_S = 0.25  # seconds per engine step: far longer than a disconnect takes to reach it
TOKENS_BEFORE_CLOSE = 3  # steps that computed the request before the client leaves
ABORTS = "paternoster:request_success_total"


@pytest.fixture(scope="module")
def slow(fake_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("abort-log") / "events.jsonl"
    log.touch()
    with fake_server(fake_model_dir, {"step_delay": STEP_S, "event_log": str(log)}) as srv:
        yield srv, log


def _events(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def _poll(fn, timeout: float, what: str):
    """``fn()`` until it returns something truthy (polled every 20 ms), or fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _open_request(url: str, path: str, body: dict) -> socket.socket:
    """POST ``body`` as JSON over a raw socket; the response is never read."""
    u = urlparse(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock = socket.create_connection((u.hostname, u.port), timeout=10)
    sock.sendall(head.encode() + payload)
    return sock


def _ran(events: list[dict], rid: str) -> list[dict]:
    return [e for e in events if "step" in e and rid in e["ran"]]


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_aborts_within_one_step(slow, path, stream):
    srv, log = slow
    srv.wait_for(lambda s: s["num_in_flight"] == 0, what="idle before the case")
    seen = len(_events(log))
    before = scrape(srv.url)
    body = {"max_tokens": 200, "ignore_eos": True, "stream": stream}
    if path == "/v1/completions":
        body["prompt"] = "Hello"
    else:
        body["messages"] = [{"role": "user", "content": "Hello"}]
    sock = _open_request(srv.url, path, body)

    def started() -> str | None:
        new = _events(log)[seen:]
        ids = {rid for e in new if "step" in e for rid in e["ran"]}
        return next((r for r in ids if len(_ran(new, r)) >= TOKENS_BEFORE_CLOSE), None)

    rid = _poll(started, 10, f"{TOKENS_BEFORE_CLOSE} steps of the request")
    closed_at = time.monotonic()
    sock.close()

    def aborted() -> dict | None:
        return next((e for e in _events(log)[seen:] if e.get("abort") == rid), None)

    abort = _poll(aborted, 5, "the engine to abort the request")
    events = _events(log)[seen:]
    later = [e for e in _ran(events, rid) if e["start"] > closed_at]
    assert len(later) <= 1, (closed_at, later)
    begun = sum(1 for e in _events(log) if "step" in e and e["start"] <= closed_at)
    assert abort["num_steps"] <= begun + 1, (abort, begun)
    assert len(_ran(events, rid)) < 200  # it never ran to completion

    def counted() -> dict | None:
        after = scrape(srv.url)
        return after if delta(after, before, ABORTS, finished_reason="abort") >= 1 else None

    after = _poll(counted, 5, "the abort in /metrics")
    assert delta(after, before, ABORTS, finished_reason="abort") == 1
    assert delta(after, before, ABORTS, finished_reason="length") == 0
    stats = srv.wait_for(
        lambda s: s["num_in_flight"] == 0 and s["engine"]["num_running"] == 0, what="idle"
    )
    assert stats["engine"]["kv_cache_usage"] == 0
