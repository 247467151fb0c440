"""The frontend's end of the ZeroMQ link to one engine process.

Two sockets, ``ipc://`` in a private temp dir (a local engine process) or
``tcp://`` on one of this node's IP addresses (a Ray actor on another node,
same messages; encrypted with ZeroMQ CURVE and open only to the engine given
:attr:`EngineLink.engine_keys`, see :mod:`paternoster.engine.curve`): a PUSH the frontend sends
:data:`~paternoster.engine.messages.ToEngine` messages on and a PULL it
receives :data:`~paternoster.engine.messages.FromEngine` messages from (the
engine process connects to both). A message is encoded when it is sent
(a bad one is refused to its sender at once) and its frame goes through an
outbox, so callers never await the socket; received messages are dispatched by type to the handler
that owns them. Every message received, heartbeats included, stamps
:attr:`EngineLink.last_seen`, the supervisor's evidence that the engine lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from paternoster.engine.codec import (
    AsyncPullQueue,
    AsyncPushQueue,
    CodecError,
    MessageCodec,
)
from paternoster.engine.curve import EngineKeys, LinkKeys
from paternoster.engine.messages import FromEngine, ToEngine

logger = logging.getLogger("paternoster.frontend")


class EngineLink:
    """Sockets, outbox and receive loop of one engine link.

    Args:
        handlers: ``{message type: handler(msg)}`` for the messages received
            after :meth:`run` starts (unknown types are logged and dropped).
    """

    def __init__(self, handlers: dict[type, Callable[[Any], None]]):
        self.handlers = handlers
        self.input_address = self.output_address = ""
        self.last_seen = 0.0  # time.monotonic() of the latest message from the engine
        self._ctx: zmq.asyncio.Context | None = None
        self._keys: LinkKeys | None = None  # tcp links only
        self._tmpdir: str | None = None
        self._push: AsyncPushQueue | None = None
        self._pull: AsyncPullQueue | None = None
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []

    @property
    def engine_keys(self) -> EngineKeys | None:
        """What the engine needs to connect to a tcp link (server public key,
        its own keypair), made by :meth:`bind`; ``None`` for ``ipc://``."""
        return self._keys.engine if self._keys is not None else None

    def bind(self, host: str | None = None) -> tuple[str, str]:
        """Bind both sockets: in a private socket dir, or on ``host``'s tcp
        ports chosen by the system, as CURVE servers with new keys (only the
        engine holding :attr:`engine_keys` can connect).

        Args:
            host: an IP address of this machine to bind tcp sockets on (the
                engines connect from other nodes); ``None``: ``ipc://``.
        Returns:
            ``(input address, output address)``: where the engine PULLs its
            inputs from and PUSHes its outputs to.
        Raises:
            zmq.ZMQError: ``host`` is not an address of this machine.
            ValueError: ``host`` given and this libzmq has no CURVE (a tcp
                link never runs in plain text).
        """
        keys = LinkKeys() if host is not None else None  # first: refuse before binding
        self._ctx = zmq.asyncio.Context()
        push = self._ctx.socket(zmq.PUSH)
        pull = self._ctx.socket(zmq.PULL)
        push.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.LINGER, 0)
        self._push = AsyncPushQueue(push, MessageCodec(ToEngine))
        self._pull = AsyncPullQueue(pull, MessageCodec(FromEngine))
        try:
            if keys is None:
                self._tmpdir = tempfile.mkdtemp(prefix="paternoster-")
                push.bind(f"ipc://{self._tmpdir}/in")
                pull.bind(f"ipc://{self._tmpdir}/out")
            else:
                self._keys = keys
                keys.start(self._ctx)  # the ZAP handler before the sockets bind
                for sock in (push, pull):
                    keys.apply(sock)
                    sock.bind(f"tcp://{host}:*")
        except BaseException:
            self._release()
            raise
        self.input_address = push.getsockopt_string(zmq.LAST_ENDPOINT)
        self.output_address = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        if keys is not None:  # system-chosen ports: say which, for a firewall rule
            logger.info("engine link (CURVE) bound on %s and %s",
                        self.input_address, self.output_address)  # fmt: skip
        return self.input_address, self.output_address

    def send(self, msg: msgspec.Struct) -> None:
        """Encode ``msg`` now (once) and queue the frame for the engine (never
        blocks; frames go out in order).

        Raises:
            CodecError: ``msg`` cannot be encoded within the frame limit
                (nothing is queued).
        """
        self._outbox.put_nowait(self._push.codec.encode(msg))

    def clear_outbox(self) -> None:
        """Drop what is queued and not sent (meant for an engine that died)."""
        while not self._outbox.empty():
            self._outbox.get_nowait()

    async def send_now(self, msg: msgspec.Struct) -> None:
        """Send ``msg`` before anything queued (the handshake, the goodbye).

        Raises:
            CodecError: ``msg`` cannot be encoded.
        """
        await self._push.put(msg)

    async def receive(self) -> Any:
        """The next well-formed message, before :meth:`run` (the handshake).
        Malformed frames are logged and skipped."""
        while True:
            try:
                msg = await self._pull.get()
            except CodecError as e:
                logger.error("dropping malformed frame from engine: %s", e)
                continue
            self.last_seen = time.monotonic()
            return msg

    def run(self) -> None:
        """Start the send and receive loops (after the handshake)."""
        self.last_seen = time.monotonic()
        self._tasks = [asyncio.create_task(self._send_loop()),
                       asyncio.create_task(self._recv_loop())]  # fmt: skip

    async def close(self) -> None:
        """Stop the loops, close the sockets and remove the socket dir. Idempotent."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []
        self._release()

    def _release(self) -> None:
        """Close the sockets, then stop the ZAP handler (in that order: no
        connection is ever let in unchecked), end the context, remove the dir."""
        for queue in (self._push, self._pull):
            if queue is not None:
                queue.socket.close(linger=0)
        if self._keys is not None:
            self._keys.stop()
            self._keys = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    async def _send_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            await self._push.socket.send(frame, copy=False)

    async def _recv_loop(self) -> None:
        while True:
            msg = await self.receive()
            handler = self.handlers.get(type(msg))
            if handler is None:
                logger.error("dropping an unexpected %s message", type(msg).__name__)
                continue
            try:
                handler(msg)
            except Exception:  # one message must never stop the loop
                logger.exception("error handling a %s message", type(msg).__name__)
