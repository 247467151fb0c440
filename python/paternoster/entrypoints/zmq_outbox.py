"""Never-blocking sends to the ZeroMQ client protocol's peers (docs/protocol.md,
"Limits and slow clients").

When a client's queue on the ROUTER socket is full (``SNDHWM`` messages),
further messages wait in a per-client backlog where the deltas of one request
merge into one; a client whose backlog exceeds ``max_backlog_bytes``, or that
read nothing for ``slow_client_timeout`` seconds while messages waited, has
its requests aborted with ``slow_client``. A client that disconnected is
noticed at the next send (ZeroMQ reports the peer gone) and its requests are
aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from paternoster.client import protocol as p
from paternoster.engine.codec import CodecError, encode

logger = logging.getLogger("paternoster.zmq")

_FLUSH_PERIOD_S = 0.005


@dataclass
class Peer:
    """One client connection (a DEALER identity) and what the server holds for it."""

    identity: bytes
    envelope: list[bytes]  # frames between identity and body, mirrored back ([] or [b""])
    welcomed: bool = False
    requests: dict[str, asyncio.Task] = field(default_factory=dict)
    backlog: deque = field(default_factory=deque)  # messages ZeroMQ could not take yet
    backlog_deltas: dict[str, dict] = field(default_factory=dict)  # id -> its pending delta
    backlog_bytes: int = 0
    blocked_since: float | None = None  # monotonic s of the first message in the backlog
    last_seen: float = 0.0
    gone: bool = False


class Outbox:
    """The sending half of the client-protocol server.

    Args:
        peers: the server's connections by identity (shared: a peer found
            gone is removed from it).
        max_frame_bytes: the largest frame sent.
        max_backlog_bytes: a client's backlog beyond this aborts its requests.
        slow_client_timeout: seconds a client may leave its backlog unread.
    """

    def __init__(self, peers: dict[bytes, Peer], max_frame_bytes: int, max_backlog_bytes: int,
                 slow_client_timeout: float):  # fmt: skip
        self.peers = peers
        self.max_frame_bytes = max_frame_bytes
        self.max_backlog_bytes = max_backlog_bytes
        self.slow_client_timeout = slow_client_timeout
        self.sock: zmq.asyncio.Socket | None = None  # the bound ROUTER socket
        self.wakeup = asyncio.Event()

    def send(self, peer: Peer, msg: dict) -> None:
        """Queue ``msg`` for ``peer``: straight to ZeroMQ when its queue has room,
        else into the peer's backlog (deltas of one request merged)."""
        if peer.gone:
            return
        if msg["type"] in (p.DELTA, p.FINAL) and msg["id"] not in peer.requests:
            return  # a request taken away by fail_slow: its error is its final
        if peer.backlog or not self._transmit(peer, msg):
            self._enqueue(peer, msg)

    def _transmit(self, peer: Peer, msg: dict) -> bool:
        """Hand ``msg`` to ZeroMQ now.

        Returns:
            False when the peer's queue is full (nothing was sent); True when it
            was sent, or dropped: unencodable (never for our own messages), or
            the peer is gone (then :meth:`on_gone` has run).
        """
        try:
            frame = encode(msg, self.max_frame_bytes)
        except CodecError as e:
            logger.error("cannot encode a reply: %s", e)
            return True
        try:
            self._send_now(peer, frame)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            self.on_gone(peer)
        return True

    def _send_now(self, peer: Peer, frame: bytes) -> None:
        """Hand one frame to ZeroMQ without waiting.

        pyzmq's asyncio socket resolves a ``DONTWAIT`` send at once (when no
        other send waits, which never happens here: every send is ``DONTWAIT``)
        and reports ZeroMQ's error in the returned future, not by raising; this
        raises it.

        Raises:
            zmq.Again: the peer's queue is full (``SNDHWM``).
            zmq.ZMQError: ``EHOSTUNREACH`` when the peer is gone.
        """
        sent = self.sock.send_multipart([peer.identity, *peer.envelope, frame],
                                         flags=zmq.DONTWAIT)  # fmt: skip
        if not sent.done():  # not expected; never leave an error unretrieved
            sent.add_done_callback(lambda f: f.cancelled() or f.exception())
            return
        error = sent.exception()
        if error is not None:
            raise error

    def _enqueue(self, peer: Peer, msg: dict) -> None:
        """Append ``msg`` to the backlog, merged into its request's pending delta
        when there is one; fail the client once the backlog is too big."""
        rid = msg.get("id")
        pending = peer.backlog_deltas.get(rid) if isinstance(rid, str) else None
        if msg["type"] == p.DELTA and pending is not None:
            pending["text"] += msg["text"]
            pending["token_ids"].extend(msg["token_ids"])
            if "logprobs" in msg and "logprobs" in pending:
                for mine, more in zip(pending["logprobs"], msg["logprobs"]):
                    mine.extend(more)
            peer.backlog_bytes += _size(msg) - _size_overhead
        else:
            peer.backlog.append(msg)
            peer.backlog_bytes += _size(msg)
            if msg["type"] == p.DELTA:
                peer.backlog_deltas[rid] = msg
            elif isinstance(rid, str):
                peer.backlog_deltas.pop(rid, None)  # its final: nothing merges past it
        if peer.blocked_since is None:
            peer.blocked_since = time.monotonic()
        if peer.backlog_bytes > self.max_backlog_bytes:
            self.fail_slow(peer, f"backlog over {self.max_backlog_bytes} bytes")
        self.wakeup.set()

    def fail_slow(self, peer: Peer, why: str) -> None:
        """Abort ``peer``'s requests; each gets a ``slow_client`` error as its
        final, queued after the finals already waiting (pending deltas are dropped)."""
        logger.warning("client is not reading (%s): aborting its %d requests", why,
                       len(peer.requests))  # fmt: skip
        failed = sorted(peer.requests)
        for task in peer.requests.values():
            task.cancel()
        peer.requests.clear()  # the tasks see they were taken and send nothing
        kept = [m for m in peer.backlog if m["type"] != p.DELTA]
        kept += [error_message(p.SLOW_CLIENT, f"the client did not read its messages: {why}",
                        request_id=rid) for rid in failed]  # fmt: skip
        peer.backlog = deque(kept)
        peer.backlog_deltas.clear()
        peer.backlog_bytes = sum(map(_size, kept))
        peer.blocked_since = time.monotonic()

    def on_gone(self, peer: Peer) -> None:
        """The client disconnected: abort its requests and forget it."""
        peer.gone = True
        for task in peer.requests.values():
            task.cancel()
        peer.requests.clear()
        peer.backlog.clear()
        peer.backlog_deltas.clear()
        if self.peers.get(peer.identity) is peer:
            del self.peers[peer.identity]

    async def flush_loop(self) -> None:
        """Retry the backlogs every few ms while any client has one."""
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            while any(q.backlog for q in self.peers.values()):
                for peer in [q for q in self.peers.values() if q.backlog]:
                    self.flush(peer)
                await asyncio.sleep(_FLUSH_PERIOD_S)

    def flush(self, peer: Peer) -> None:
        """Send what ZeroMQ takes of ``peer``'s backlog; enforce the slow-client timeout."""
        while peer.backlog and not peer.gone:
            msg = peer.backlog[0]
            if not self._transmit(peer, msg):
                break
            if peer.gone:
                return
            peer.backlog.popleft()
            peer.backlog_bytes -= _size(msg)
            if peer.backlog_deltas.get(msg.get("id")) is msg:
                del peer.backlog_deltas[msg["id"]]
            peer.blocked_since = time.monotonic()  # the client is reading
        if not peer.backlog:
            peer.blocked_since, peer.backlog_bytes = None, 0
        elif time.monotonic() - peer.blocked_since > self.slow_client_timeout:
            if peer.requests:
                self.fail_slow(peer, f"nothing read for {self.slow_client_timeout:g} s")
            else:  # only finals are left and nobody reads them
                self.on_gone(peer)


_size_overhead = 64  # bytes counted per message in a backlog, besides text and token ids


def _size(msg: dict) -> int:
    """Approximate bytes of a message in a backlog."""
    return _size_overhead + len(msg.get("text", "")) + 8 * len(msg.get("token_ids", ()))


def error_message(code: str, message: str, param: str | None = None,
                  request_id: str | None = None, **extra: Any) -> dict:  # fmt: skip
    """A protocol ``error`` message (``None`` fields left out)."""
    return p.message(p.ERROR, id=request_id, code=code, message=message, param=param, **extra)
