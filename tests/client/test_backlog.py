"""The client protocol server's per-client backlog (slow clients).

Over TCP or IPC the kernel's socket buffers hold megabytes of small messages,
so a test of a whole server cannot reach ZeroMQ's high-water mark in
reasonable time. These tests drive the server's send path through a stand-in
socket that refuses sends (``zmq.Again``) while "full", and through a real
ROUTER/DEALER pair on ``inproc://`` (no kernel buffers: the high-water marks
are all there is).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from types import SimpleNamespace

import msgpack
import zmq
import zmq.asyncio

from paternoster.client import protocol as p
from paternoster.entrypoints.zmq_server import Peer, ZmqServer


class FullSocket:
    """Accepts sends only while ``room`` > 0; records the bodies it took. Like
    pyzmq's asyncio socket, a send returns a resolved future holding the error."""

    def __init__(self, room: int = 0):
        self.room = room
        self.sent: list[dict] = []
        self.gone = False

    def send_multipart(self, frames, flags=0) -> Future:
        done: Future = Future()
        if self.gone:
            done.set_exception(zmq.ZMQError(zmq.EHOSTUNREACH))
        elif self.room <= 0:
            done.set_exception(zmq.Again())
        else:
            self.room -= 1
            self.sent.append(msgpack.unpackb(frames[-1]))
            done.set_result(None)
        return done


def _server(**kw) -> tuple[ZmqServer, Peer, FullSocket]:
    srv = ZmqServer(frontend=None, address="inproc://unused", **kw)
    sock = FullSocket()
    srv._sock = srv.outbox.sock = sock
    peer = Peer(b"peer", [])
    srv._peers[peer.identity] = peer
    return srv, peer, sock


def _delta(rid: str, text: str, ids: list[int]) -> dict:
    return p.message(p.DELTA, id=rid, text=text, token_ids=ids)


def _final(rid: str) -> dict:
    return p.message(p.FINAL, id=rid, text="", token_ids=[], finish_reason="length")


def _in_flight(peer: Peer, *ids: str) -> None:
    for rid in ids:
        peer.requests[rid] = object()  # stands for the request's task


def test_deltas_merge_per_request_and_order_is_kept():
    srv, peer, sock = _server()
    _in_flight(peer, "a", "b")
    for i in range(50):
        srv._send(peer, _delta("a", f"a{i} ", [i]))
        srv._send(peer, _delta("b", f"b{i} ", [100 + i]))
    srv._send(peer, _final("a"))
    srv._send(peer, _delta("b", "late ", [999]))
    srv._send(peer, _final("b"))
    assert len(peer.backlog) == 4  # a's delta, b's delta, a's final, b's final
    sock.room = 10**6
    srv.outbox.flush(peer)
    assert not peer.backlog and peer.backlog_bytes == 0 and peer.blocked_since is None
    a = [m for m in sock.sent if m["id"] == "a"]
    b = [m for m in sock.sent if m["id"] == "b"]
    assert [m["type"] for m in a] == ["delta", "final"]
    assert a[0]["token_ids"] == list(range(50))
    assert a[0]["text"] == "".join(f"a{i} " for i in range(50))
    assert [m["type"] for m in b] == ["delta", "final"]
    assert b[0]["token_ids"] == [100 + i for i in range(50)] + [999]


def test_a_delta_after_a_partial_flush_is_not_merged_into_a_sent_one():
    srv, peer, sock = _server()
    _in_flight(peer, "a")
    srv._send(peer, _delta("a", "x", [1]))
    srv._send(peer, _delta("a", "y", [2]))
    sock.room = 1
    srv.outbox.flush(peer)  # the merged delta goes out
    srv._send(peer, _delta("a", "z", [3]))  # the backlog is empty: straight out? no room
    sock.room = 5
    srv.outbox.flush(peer)
    ids = [t for m in sock.sent for t in m["token_ids"]]
    assert ids == [1, 2, 3]


def test_backlog_over_the_byte_limit_fails_the_clients_requests():
    async def run():
        srv, peer, sock = _server(max_backlog_bytes=10_000)
        task = asyncio.create_task(asyncio.sleep(60))
        peer.requests["big"] = task
        _in_flight(peer, "done-before")
        srv._send(peer, _final("done-before"))
        del peer.requests["done-before"]
        for i in range(2000):
            srv._send(peer, _delta("big", "word ", [i]))
        await asyncio.sleep(0)
        assert task.cancelled() and not peer.requests
        sock.room = 100
        srv.outbox.flush(peer)
        assert [(m["type"], m["id"], m.get("code")) for m in sock.sent] == [
            ("final", "done-before", None), ("error", "big", p.SLOW_CLIENT)
        ]

    asyncio.run(run())


def test_client_that_reads_nothing_for_the_timeout_is_failed():
    async def run():
        srv, peer, sock = _server(slow_client_timeout=0.05)
        task = asyncio.create_task(asyncio.sleep(60))
        peer.requests["r"] = task
        srv._send(peer, _delta("r", "a", [1]))
        srv.outbox.flush(peer)
        assert peer.requests  # not yet
        time.sleep(0.06)
        srv.outbox.flush(peer)
        await asyncio.sleep(0)
        assert task.cancelled() and not peer.requests
        assert [m["type"] for m in peer.backlog] == [p.ERROR]
        time.sleep(0.06)
        srv.outbox.flush(peer)  # nothing in flight and still unread: the client is dropped
        assert peer.gone and peer.identity not in srv._peers

    asyncio.run(run())


def test_vanished_client_is_dropped_and_its_requests_aborted():
    async def run():
        srv, peer, sock = _server()
        task = asyncio.create_task(asyncio.sleep(60))
        peer.requests["r"] = task
        sock.gone = True
        srv._send(peer, _delta("r", "a", [1]))
        await asyncio.sleep(0)
        assert task.cancelled() and peer.gone and not srv._peers

    asyncio.run(run())


def test_real_sockets_slow_reader_gets_every_token_merged():
    """A DEALER that does not read while 500 deltas are sent: ZeroMQ's queues
    fill (4 + 4 messages), the rest waits in the backlog and merges; once the
    client reads, it gets every token in order and the final."""

    async def run():
        serving = SimpleNamespace(model_name="m", max_model_len=64,
                                  client=SimpleNamespace(unavailable_reason=None))  # fmt: skip
        srv = ZmqServer(serving, "inproc://backlog-test", sndhwm=4)
        await srv.start()
        dealer = srv._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 4)
        dealer.connect("inproc://backlog-test")
        try:
            await dealer.send(msgpack.packb({"v": 1, "type": "hello"}))
            assert msgpack.unpackb(await dealer.recv())["type"] == p.WELCOME
            (peer,) = srv._peers.values()
            _in_flight(peer, "a")
            for i in range(500):
                srv._send(peer, _delta("a", f"{i} ", [i]))
            srv._send(peer, _final("a"))
            del peer.requests["a"]  # as the request's task does after its final
            assert peer.backlog  # ZeroMQ refused some: the backlog holds them
            got = []
            while True:
                m = msgpack.unpackb(await asyncio.wait_for(dealer.recv(), 10))
                got.append(m)
                if m["type"] == p.FINAL:
                    break
            ids = [t for m in got for t in m["token_ids"]]
            assert ids == list(range(500))
            assert "".join(m["text"] for m in got) == "".join(f"{i} " for i in range(500))
            assert len(got) < 100  # merged
            assert not peer.backlog
        finally:
            dealer.close(0)
            await srv.close()

    asyncio.run(run())
