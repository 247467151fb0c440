"""Aborts over the client protocol, counted in engine steps: an ``abort``
message reaches the engine within one step; a streaming client that vanishes
is noticed at the next token the server sends it, and its request aborted.

Same method as tests/hardening/test_abort_within_a_step.py: the fake engine
takes ``STEP_S`` per step and logs its steps and aborts.
"""

from __future__ import annotations

import json
import time

import msgpack
import pytest
import zmq

from tests.client.conftest import zmq_server
from tests.hardening.test_abort_within_a_step import _events, _poll, _ran

STEP_S = 0.25
TOKENS_BEFORE = 3


@pytest.fixture(scope="module")
def slow(fake_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("zmq-abort-log") / "events.jsonl"
    log.touch()
    with zmq_server(fake_model_dir, {"step_delay": STEP_S, "event_log": str(log)}) as srv:
        yield srv, log


def _dealer(address: str) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send(msgpack.packb({"v": 1, "type": "hello"}))
    assert sock.poll(10_000) and msgpack.unpackb(sock.recv())["type"] == "welcome"
    return ctx, sock


def _start(log, sock, stream: bool) -> str:
    """Send a long request; return its engine id once it ran TOKENS_BEFORE steps."""
    seen = len(_events(log))
    sock.send(msgpack.packb({"v": 1, "type": "generate", "id": "r", "prompt_token_ids": [5],
                             "stream": stream, "sampling": {"max_tokens": 200}}))

    def started() -> str | None:
        new = _events(log)[seen:]
        ids = {rid for e in new if "step" in e for rid in e["ran"]}
        return next((r for r in ids if len(_ran(new, r)) >= TOKENS_BEFORE), None)

    return _poll(started, 10, f"{TOKENS_BEFORE} steps of the request")


def _steps_after(log, rid: str, t: float, timeout: float) -> tuple[list[dict], dict]:
    abort = _poll(lambda: next((e for e in _events(log) if e.get("abort") == rid), None),
                  timeout, "the engine to abort the request")  # fmt: skip
    return [e for e in _ran(_events(log), rid) if e["start"] > t], abort


def _index(log, event: dict) -> int:
    """Where ``event`` sits in the log (the events before it happened before it)."""
    return _events(log).index(event)


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_abort_message_reaches_the_engine_within_one_step(slow, stream):
    srv, log = slow
    ctx, sock = _dealer(srv.address)
    try:
        rid = _start(log, sock, stream)
        sent_at = time.monotonic()
        sock.send(msgpack.packb({"v": 1, "type": "abort", "id": "r"}))
        later, abort = _steps_after(log, rid, sent_at, 5)
        assert len(later) <= 1, later
        ran = len(_ran(_events(log)[: _index(log, abort)], rid))  # steps with its token
        while True:  # the request's final still comes, with finish_reason abort
            assert sock.poll(10_000)
            m = msgpack.unpackb(sock.recv())
            if m["type"] != "delta":
                break
        assert (m["type"], m["finish_reason"]) == ("final", "abort")
        assert m["usage"]["completion_tokens"] < 200
        if not stream:
            # the tokens the frontend had when the abort reached it: every step's but
            # perhaps the last (the engine logs a step before its output crosses the
            # engine link, so the abort can overtake it), never more than ran
            assert len(m["token_ids"]) == m["usage"]["completion_tokens"]
            assert 1 <= m["usage"]["completion_tokens"] <= ran
    finally:
        sock.close(0)
        ctx.term()
    srv.http.wait_for(lambda s: s["num_in_flight"] == 0, what="idle")


def test_vanished_streaming_client_is_aborted_at_its_next_token(slow):
    srv, log = slow
    ctx, sock = _dealer(srv.address)
    rid = _start(log, sock, stream=True)
    gone_at = time.monotonic()
    sock.close(0)
    ctx.term()
    later, _ = _steps_after(log, rid, gone_at, 10)
    # the step running at the close sends the next token, which finds the peer gone
    # (ZeroMQ may still route one more into the closing pipe): at most two more steps
    assert len(later) <= 2, later
    stats = srv.http.wait_for(lambda s: s["num_in_flight"] == 0, what="idle")
    assert stats["engine"]["kv_cache_usage"] == 0
    assert json.dumps(stats)  # /stats stays well-formed
