"""A burst of requests at a whole server with ``--max-waiting-requests``
while the engine drains nothing (one request runs at a time and a long one
holds it): over HTTP and over the ZeroMQ protocol, exactly the cap is
admitted and the rest are refused at once, the waiting queue never grows
past the cap, and once the burst is aborted nothing stays waiting or
reserved (docs/errors.md, "Overload").

Each burst reaches the server faster than it sends requests on to the
engine: ZeroMQ messages queued on the socket are all read, and their
capacity checks run, before the first of them is sent (there is no await in
between for ``prompt_token_ids``).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgpack
import pytest
import zmq

from tests.client.conftest import zmq_server
from tests.entrypoints.utils import Server

CAP = 3
BURST = 20


def _settled(http: Server) -> dict:
    """/stats once the burst has been sent on (nothing reserved), 0.3 s later."""
    http.wait_for(lambda s: s["num_waiting"] >= CAP and s.get("num_reserved", 0) == 0,
                  what="the admitted requests to be sent")  # fmt: skip
    time.sleep(0.3)  # a queue past the cap would show by now
    return http.get("/stats").json()


def _idle(http: Server) -> None:
    http.wait_for(lambda s: s["num_in_flight"] == 0 and s["num_waiting"] == 0
                  and s["num_reserved"] == 0 and s["num_reserved_tokens"] == 0
                  and s["engine"]["num_running"] == 0, what="idle")  # fmt: skip


async def _http_burst(server: Server) -> tuple[dict, list[httpx.Response]]:
    """Start a long runner, then BURST streams at once. Returns /stats while the
    admitted ones wait and the responses that came meanwhile (the refusals: an
    admitted stream's head only comes with its first token); the rest are
    then cancelled, which aborts them."""
    limits = httpx.Limits(max_connections=BURST + 5)
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as http:
        runner_body = {"prompt": "Hello", "max_tokens": 200, "stream": True}  # echoed
        async with http.stream("POST", "/v1/completions", json=runner_body) as runner:
            lines = runner.aiter_lines()  # kept: closing it would close the connection
            await lines.__anext__()  # it runs: the burst must wait

            async def one(i: int) -> httpx.Response:
                body = {"prompt": [5, 100 + i], "max_tokens": 2, "stream": True}
                return await http.post("/v1/completions", json=body)

            tasks = [asyncio.ensure_future(one(i)) for i in range(BURST)]
            try:
                stats = await asyncio.to_thread(_settled, server)
                done = [t.result() for t in tasks if t.done()]
            finally:
                for t in tasks:  # a client that goes away aborts its request
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await lines.aclose()
    return stats, done


class _Dealer:
    def __init__(self, address: str):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, msg: dict) -> None:
        self.sock.send(msgpack.packb({"v": 1, **msg}, use_bin_type=True))

    def recv(self, timeout_ms: int = 10_000) -> dict:
        assert self.sock.poll(timeout_ms), "no message from the server"
        return msgpack.unpackb(self.sock.recv(), raw=False)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture(scope="module")
def capped(fake_model_dir):
    """One request runs at a time (50 ms a step); CAP may wait."""
    opts = {"step_delay": 0.05, "max_running": 1}
    with zmq_server(fake_model_dir, opts, "--max-waiting-requests", str(CAP)) as srv:
        yield srv


def test_an_http_burst_gets_exactly_the_cap(capped):
    http = capped.http
    http.wait_for(lambda s: s["num_in_flight"] == 0, what="a previous test's requests to end")
    stats, done = asyncio.run(_http_burst(http))
    assert stats["num_waiting"] == CAP, stats
    assert len(done) == BURST - CAP, [r.text for r in done]
    for r in done:
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        error = r.json()["error"]
        assert error["type"] == "ServiceUnavailableError" and error["code"] == 503, error
        assert "--max-waiting-requests 3" in error["message"], error
    _idle(http)


def test_a_zeromq_burst_gets_exactly_the_cap(capped):
    http = capped.http
    http.wait_for(lambda s: s["num_in_flight"] == 0, what="a previous test's requests to end")
    holder, c = _Dealer(capped.address), None
    try:
        holder.send({"type": "hello"})
        assert holder.recv()["type"] == "welcome"
        holder.send({"type": "generate", "id": "runner", "prompt_token_ids": [1],
                     "sampling": {"max_tokens": 200}, "stream": True})  # fmt: skip
        assert holder.recv()["type"] == "delta"  # it runs: the burst must wait
        # A new connection's messages queue up until it is connected, then go
        # out together: the server reads them all before it sends any on.
        c = _Dealer(capped.address)
        c.send({"type": "hello"})
        for i in range(BURST):
            c.send({"type": "generate", "id": f"r{i}", "prompt_token_ids": [5, 100 + i],
                    "sampling": {"max_tokens": 2}})  # fmt: skip
        assert c.recv()["type"] == "welcome"
        stats = _settled(http)
        replies = []
        while c.sock.poll(0):
            replies.append(c.recv())
        assert stats["num_waiting"] == CAP, stats
        assert len(replies) == BURST - CAP, replies
        for m in replies:
            assert m["type"] == "error" and m["code"] == "overloaded", m
            assert m["retry_after"] == 1 and "--max-waiting-requests 3" in m["message"], m
        admitted = {f"r{i}" for i in range(BURST)} - {m["id"] for m in replies}
        for rid in admitted:
            c.send({"type": "abort", "id": rid})
        finals = set()
        while finals != admitted:
            m = c.recv()
            assert m["type"] == "final" and m["finish_reason"] == "abort", m
            finals.add(m["id"])
        holder.send({"type": "abort", "id": "runner"})
    finally:
        holder.close()
        if c is not None:
            c.close()
    _idle(http)
