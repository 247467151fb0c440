"""The asyncio client of the ZeroMQ/msgpack protocol (docs/protocol.md).

One :class:`AsyncClient` is one DEALER connection shared by any number of
concurrent requests: a reader task files each incoming message under its
request. Create it with ``await AsyncClient.connect(address)``.

Example::

    import asyncio
    from paternoster.client import AsyncClient

    async def main():
        async with await AsyncClient.connect("tcp://127.0.0.1:5555") as c:
            print((await c.generate("Hello", max_tokens=8)).text)
            async for delta in c.stream("Once upon a time", max_tokens=32):
                print(delta.text, end="", flush=True)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio

from paternoster.client import protocol as p
from paternoster.client._common import (
    Accumulator,
    ClientError,
    Completion,
    Delta,
    ProtocolError,
    dealer,
    delta_from,
    error_from,
    generate_message,
    hello_message,
    no_server_message,
    pack,
    unpack,
)
from paternoster.client.sync import DEFAULT_MAX_INCOMING_BYTES


class AsyncClient:
    """An asyncio client; build it with :meth:`connect`.

    Attributes:
        server_info: the ``welcome`` message's fields (model, max_model_len, limits).
    """

    def __init__(self, sock: zmq.asyncio.Socket, ctx: zmq.asyncio.Context,
                 timeout: float | None, max_incoming_bytes: int):  # fmt: skip
        self._sock = sock
        self._ctx = ctx
        self.timeout = timeout
        self._max_in = max_incoming_bytes
        self._queues: dict[str, asyncio.Queue] = {}
        self._draining: set[str] = set()  # aborted here; their final is still to come
        self._unanswered: dict[str, bytes] = {}  # request id -> its frame, until a reply
        self._waiters: dict[tuple[str, str | None], asyncio.Future] = {}
        self._qids = itertools.count()
        self._reader: asyncio.Task | None = None
        self._broken: BaseException | None = None
        self.server_info: dict = {}
        self._hello = b""

    @classmethod
    async def connect(
        cls, address: str, api_key: str | None = None, timeout: float | None = 30.0,
        client_name: str | None = "paternoster.client",
        max_incoming_bytes: int = DEFAULT_MAX_INCOMING_BYTES,
    ) -> AsyncClient:
        """Connect and handshake.

        Args:
            address: the server's ``--zmq-address``.
            api_key: the server's ``--api-key``, if any.
            timeout: default seconds for the handshake and for each message of
                a request (``None``: forever).
            client_name: sent in the handshake.
            max_incoming_bytes: larger server messages are refused by ZeroMQ.
        Raises:
            TimeoutError: no ``welcome`` in time.
            ProtocolError: the handshake failed (``unauthorized``, ``unsupported_version``).
            ValueError: ``address`` is not a ZeroMQ endpoint.
        """
        ctx = zmq.asyncio.Context()
        sock = dealer(ctx, address, max_incoming_bytes)
        self = cls(sock, ctx, timeout, max_incoming_bytes)
        self._reader = asyncio.create_task(self._read_loop())
        self._hello = pack(hello_message(api_key, client_name))
        try:
            await self._sock.send(self._hello)
            welcome = await self._await_reply(p.WELCOME, None, timeout)
        except TimeoutError:
            await self.close()
            raise TimeoutError(no_server_message(address, timeout)) from None
        except BaseException:
            await self.close()
            raise
        self.server_info = {k: v for k, v in welcome.items() if k not in ("v", "type")}
        return self

    # ------------------------------------------------------------ requests

    async def generate(
        self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
        request_id: str | None = None, priority: int = 0, add_special_tokens: bool = True,
        timeout: float | None = None, **sampling: Any,
    ) -> Completion:
        """Run one request to its end; arguments as :meth:`Client.generate`.
        Cancelling the call aborts the request.

        Raises:
            ClientError: the server's ``error`` for the request.
            TimeoutError: not finished within ``timeout`` s (it is aborted).
        """
        rid, queue = await self._send_generate(prompt, prompt_token_ids, request_id, False,
                                               priority, add_special_tokens, sampling)  # fmt: skip
        acc = Accumulator(rid)
        done = False

        async def run() -> Completion:
            nonlocal done
            while True:
                try:
                    completion = acc.add(await self._next(rid, queue))
                except ClientError:
                    done = True
                    raise
                if completion is not None:
                    done = True
                    return completion

        try:
            return await _within(run(), self.timeout if timeout is None else timeout)
        finally:
            self._queues.pop(rid, None)
            self._unanswered.pop(rid, None)
            if not done:
                await self._abandon(rid)

    async def stream(
        self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
        request_id: str | None = None, priority: int = 0, add_special_tokens: bool = True,
        timeout: float | None = None, **sampling: Any,
    ) -> AsyncIterator[Delta]:
        """Yield a streamed request's :class:`Delta` pieces; arguments as
        :meth:`Client.generate`, ``timeout`` bounding the wait for each piece.
        Leaving the loop early (``break``, ``aclose()``, cancellation) aborts it.

        Raises:
            ClientError: the server's ``error`` for the request.
            TimeoutError: no piece within ``timeout`` s (the request is aborted).
        """
        rid, queue = await self._send_generate(prompt, prompt_token_ids, request_id, True,
                                               priority, add_special_tokens, sampling)  # fmt: skip
        wait = self.timeout if timeout is None else timeout
        done = False
        try:
            while not done:
                try:
                    msg = await _within(self._next(rid, queue), wait)
                except ClientError:
                    done = True
                    raise
                done = msg["type"] == p.FINAL
                yield delta_from(msg)
        finally:
            self._queues.pop(rid, None)
            self._unanswered.pop(rid, None)
            if not done:
                await self._abandon(rid)

    async def abort(self, request_id: str) -> None:
        """Ask the server to abort a request (unknown ids are ignored)."""
        await self._sock.send(pack(p.message(p.ABORT, id=request_id)))

    async def models(self, timeout: float | None = None) -> list[dict]:
        """The served models: ``[{"id": name, "max_model_len": tokens}]``."""
        return list((await self._query(p.MODELS, timeout)).get("data", []))

    async def health(self, timeout: float | None = None) -> dict:
        """``{"status": "ok"}`` or ``{"status": "unhealthy", "reason": ...}``."""
        reply = await self._query(p.HEALTH, timeout)
        return {k: v for k, v in reply.items() if k in ("status", "reason")}

    async def close(self) -> None:
        """Stop the reader and close the connection."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        self._sock.close(0)
        self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------- internals

    async def _send_generate(
        self, prompt, prompt_token_ids, request_id, stream, priority, add_special_tokens, sampling
    ) -> tuple[str, asyncio.Queue]:
        rid, msg = generate_message(prompt, prompt_token_ids, request_id, stream, priority,
                                    add_special_tokens, sampling)  # fmt: skip
        if rid in self._queues or rid in self._draining:
            raise ValueError(f"request id {rid!r} is already in flight on this client")
        self._check_reader()
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        frame = pack(msg)
        self._unanswered[rid] = frame  # resent once if the server asks for a new hello
        await self._sock.send(frame)
        return rid, queue

    async def _next(self, rid: str, queue: asyncio.Queue) -> dict:
        while True:
            msg = await queue.get()
            if isinstance(msg, BaseException):
                raise msg
            frame = self._unanswered.pop(rid, None)
            if msg["type"] != p.ERROR:
                return msg
            if msg.get("code") == p.HANDSHAKE_REQUIRED and frame is not None:
                # the server restarted (or ZeroMQ reconnected): _route greeted it
                # again, so send the request once more behind that hello
                await self._sock.send(frame)
                continue
            raise error_from(msg)

    async def _abandon(self, rid: str) -> None:
        """Abort ``rid`` and drop its messages until its final arrives."""
        self._unanswered.pop(rid, None)
        self._draining.add(rid)
        with contextlib.suppress(Exception):
            await self.abort(rid)

    async def _query(self, kind: str, timeout: float | None) -> dict:
        qid = f"q{next(self._qids)}"
        future = self._expect(kind, qid)
        await self._sock.send(pack(p.message(kind, id=qid)))
        return await self._await_reply(kind, qid, self.timeout if timeout is None else timeout,
                                       future)  # fmt: skip

    def _expect(self, kind: str, qid: str | None) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters[(kind, qid)] = future
        return future

    async def _await_reply(self, kind: str, qid: str | None, timeout: float | None,
                           future: asyncio.Future | None = None) -> dict:  # fmt: skip
        future = future or self._waiters.get((kind, qid)) or self._expect(kind, qid)
        try:
            return await _within(asyncio.shield(future), timeout)
        finally:
            self._waiters.pop((kind, qid), None)

    def _check_reader(self) -> None:
        if self._broken is not None:
            raise ProtocolError(p.INTERNAL, f"client connection is broken: {self._broken}")

    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await self._sock.recv()
                try:
                    msg = unpack(frame, self._max_in)
                except ProtocolError:
                    continue  # a frame we cannot read cannot be routed either
                self._route(msg)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the socket failed: end everything waiting
            self._broken = e
            for q in self._queues.values():
                q.put_nowait(ProtocolError(p.INTERNAL, f"client connection failed: {e}"))
            for f in self._waiters.values():
                if not f.done():
                    f.set_exception(ProtocolError(p.INTERNAL, f"connection failed: {e}"))

    def _route(self, msg: dict) -> None:
        kind, rid = msg["type"], msg.get("id")
        if kind == p.ERROR and msg.get("code") == p.HANDSHAKE_REQUIRED:
            # ZeroMQ reconnected and the server sees a new peer: greet it again
            sent = self._sock.send(self._hello, flags=zmq.DONTWAIT)
            sent.add_done_callback(lambda f: f.cancelled() or f.exception())
        if rid in self._draining and kind in (p.DELTA, p.FINAL, p.ERROR):
            if kind != p.DELTA:  # the abandoned request's last message
                self._draining.discard(rid)
            return
        if kind in (p.DELTA, p.FINAL) or (kind == p.ERROR and rid in self._queues):
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(msg)
            return
        if kind == p.ERROR:  # a handshake or query error: fail what waits for it
            for (_kind, wid), future in self._waiters.items():
                if wid == rid and not future.done():
                    future.set_exception(error_from(msg))
                    return
            return
        future = self._waiters.get((kind, rid))
        if future is not None and not future.done():
            future.set_result(msg)


async def _within(aw: Any, timeout: float | None) -> Any:
    """Await ``aw`` for at most ``timeout`` seconds (``None``: forever).

    Raises:
        TimeoutError: the builtin one (``asyncio.TimeoutError`` before 3.11).
    """
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer from the server within {timeout} s") from None
