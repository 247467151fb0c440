"""The public ZeroMQ/msgpack client protocol's server (docs/protocol.md, "Client
protocol").

:class:`ZmqServer` binds a ROUTER socket next to the HTTP server, in the same
process and event loop, and serves ``generate``, ``abort``, ``models`` and
``health`` from DEALER clients. It maps the protocol's messages onto the
request pipeline (:class:`~paternoster.frontend.pipeline.Frontend`) the HTTP
server maps its JSON onto, so a request is tokenized, validated, admitted,
detokenized and counted the same whichever way it came in.

Guarantees (docs/protocol.md): every accepted ``generate`` gets exactly one
final message (``final`` or ``error`` with its id), as long as the client
keeps its connection and reads; deltas of a request arrive in order; a
malformed or refused message gets an ``error`` and never disturbs other
clients. Frames are size-checked before they are decoded.

Slow clients: sends never block. When a client's queue on the socket is full
(``SNDHWM`` messages), further messages wait in a per-client backlog where the
deltas of one request merge into one; a client whose backlog exceeds
``max_backlog_bytes``, or that read nothing for ``slow_client_timeout``
seconds while messages waited, has its requests aborted with ``slow_client``.
A client that disconnected is noticed at the next send (ZeroMQ reports the
peer gone) and its requests are aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from typing import Any

import zmq
import zmq.asyncio

from paternoster.client import protocol as p
from paternoster.engine.codec import CodecError, unpack
from paternoster.entrypoints.zmq_address import check_address
from paternoster.entrypoints.zmq_messages import Generate, Hello, MessageError, parse
from paternoster.entrypoints.zmq_outbox import Outbox, Peer
from paternoster.entrypoints.zmq_outbox import error_message as _error
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    InvalidRequestError,
    RequestRejectedError,
)
from paternoster.frontend.generation import Generation
from paternoster.frontend.pipeline import Frontend, RequestOptions
from paternoster.outputs import ChoiceDelta

logger = logging.getLogger("paternoster.zmq")

DEFAULT_SNDHWM = 10_000  # messages queued per client in ZeroMQ before the backlog
DEFAULT_MAX_BACKLOG_BYTES = 64 * 1024 * 1024
DEFAULT_SLOW_CLIENT_TIMEOUT = 60.0
MAX_CONNECTIONS = 10_000  # idle connection state kept at most (oldest idle dropped)
_FLUSH_PERIOD_S = 0.005


class ZmqServer:
    """Serves the client protocol on one ROUTER socket.

    Args:
        frontend: the request pipeline (shared with the HTTP server).
        address: a ZeroMQ endpoint to bind (``tcp://127.0.0.1:5555``,
            ``ipc:///path``; ``tcp://127.0.0.1:0`` picks a free port).
        api_key: when set, ``hello`` must carry it (``unauthorized`` otherwise).
        max_message_bytes: larger frames get ``message_too_large`` unread;
            frames over 4x this are dropped by ZeroMQ (``MAXMSGSIZE``), which
            closes the sender's connection.
        max_in_flight: generate requests in flight per connection.
        max_request_id_bytes: longest request id (UTF-8 bytes).
        sndhwm: messages ZeroMQ queues per client before the backlog takes over.
        max_backlog_bytes: a client's backlog beyond this aborts its requests
            (``slow_client``).
        slow_client_timeout: seconds a client may leave its backlog unread
            before its requests are aborted (``slow_client``).
    """

    def __init__(
        self,
        frontend: Frontend,
        address: str,
        api_key: str | None = None,
        max_message_bytes: int = p.DEFAULT_MAX_MESSAGE_BYTES,
        max_in_flight: int = p.DEFAULT_MAX_IN_FLIGHT,
        max_request_id_bytes: int = p.MAX_REQUEST_ID_BYTES,
        sndhwm: int = DEFAULT_SNDHWM,
        max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES,
        slow_client_timeout: float = DEFAULT_SLOW_CLIENT_TIMEOUT,
    ):
        for name, value in (
            ("max_message_bytes", max_message_bytes), ("max_in_flight", max_in_flight),
            ("max_request_id_bytes", max_request_id_bytes), ("sndhwm", sndhwm),
            ("max_backlog_bytes", max_backlog_bytes),
            ("slow_client_timeout", slow_client_timeout),
        ):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.frontend = frontend
        self.address = address
        self.api_key = api_key
        self.max_message_bytes = max_message_bytes
        self.max_in_flight = max_in_flight
        self.max_request_id_bytes = max_request_id_bytes
        self.sndhwm = sndhwm
        self.max_backlog_bytes = max_backlog_bytes
        self.slow_client_timeout = slow_client_timeout
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._peers: dict[bytes, Peer] = {}
        self._tasks: list[asyncio.Task] = []
        self.outbox = Outbox(self._peers, 4 * max_message_bytes, max_backlog_bytes,
                             slow_client_timeout)  # fmt: skip

    # ----------------------------------------------------------------- life

    async def start(self) -> str:
        """Bind the socket and start serving.

        Returns:
            The bound endpoint (``tcp://...:0`` resolved to the real port).
        Raises:
            zmq.ZMQError: the address cannot be bound (in use, bad path).
            ValueError: an ``ipc://`` path another process serves.
        """
        if self.address.startswith("ipc://"):
            check_address(self.address)  # never take over another server's socket file
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable sends raise, not vanish
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * self.max_message_bytes)
        try:
            sock.bind(self.address)
        except zmq.ZMQError:
            sock.close(0)
            self._ctx.destroy(0)
            self._ctx = None
            raise
        self._sock = self.outbox.sock = sock
        self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.address.startswith("ipc://"):
            # only this user may connect (the socket file would follow the umask)
            with contextlib.suppress(OSError):
                os.chmod(self.address[len("ipc://"):], 0o600)
        self._tasks = [asyncio.create_task(self._recv_loop()),
                       asyncio.create_task(self.outbox.flush_loop())]  # fmt: skip
        return self.address

    async def close(self) -> None:
        """Abort every request of every client, stop and unbind. Idempotent."""
        for peer in self._peers.values():
            for task in peer.requests.values():
                task.cancel()
        for task in [t for peer in self._peers.values() for t in peer.requests.values()]:
            with contextlib.suppress(BaseException):
                await task
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []
        self._peers.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self.address.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(self.address[len("ipc://"):])

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight and every backlog is sent.

        Args:
            timeout: seconds to wait at most.
        Returns:
            True when idle in time.
        """
        deadline = time.monotonic() + timeout
        while self.num_in_flight or any(q.backlog for q in self._peers.values()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    @property
    def num_in_flight(self) -> int:
        """Generate requests in flight over all connections."""
        return sum(len(peer.requests) for peer in self._peers.values())

    # -------------------------------------------------------------- receive

    async def _recv_loop(self) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                self._on_frames(frames)
            except Exception:  # one message must never stop the loop
                logger.exception("error handling a client message")

    def _on_frames(self, frames: list) -> None:
        identity = bytes(frames[0].buffer)
        parts = frames[1:]
        envelope: list[bytes] = []
        if len(parts) == 2 and len(parts[0].buffer) == 0:  # REQ-style empty delimiter
            envelope, parts = [b""], parts[1:]
        peer = self._peer(identity, envelope)
        if len(parts) != 1:
            self._send(peer, _error(p.MALFORMED_MESSAGE,
                                    f"expected one body frame, got {len(parts)}"))  # fmt: skip
            return
        body = parts[0].buffer
        if len(body) > self.max_message_bytes:
            self._send(peer, _error(
                p.MESSAGE_TOO_LARGE,
                f"message is {len(body)} bytes, over the {self.max_message_bytes} limit",
            ))  # fmt: skip
            return
        try:
            msg = unpack(body, self.max_message_bytes)
            parsed = parse(msg, self.max_request_id_bytes)
        except CodecError as e:
            self._send(peer, _error(p.MALFORMED_MESSAGE, str(e)))
            return
        except MessageError as e:
            self._send(peer, _error(e.code, str(e), e.param, e.request_id))
            return
        kind = parsed.type
        if isinstance(parsed, Hello):
            self._on_hello(peer, parsed)
        elif not peer.welcomed:
            self._send(peer, _error(p.HANDSHAKE_REQUIRED,
                                    "send a hello message first (docs/protocol.md)",
                                    request_id=getattr(parsed, "id", None)))  # fmt: skip
        elif kind == p.GENERATE:
            self._on_generate(peer, parsed)
        elif kind == p.ABORT:
            task = peer.requests.get(parsed.id)
            if task is not None:
                task.cancel()  # its final (finish_reason "abort") is sent by the task
        elif kind == p.MODELS:
            self._send(peer, p.message(p.MODELS, id=parsed.id, data=[self._model_card()]))
        elif kind == p.HEALTH:
            reason = self.frontend.client.unavailable_reason
            status = "ok" if reason is None else "unhealthy"
            self._send(peer, p.message(p.HEALTH, id=parsed.id, status=status, reason=reason))

    def _peer(self, identity: bytes, envelope: list[bytes]) -> Peer:
        peer = self._peers.get(identity)
        if peer is None:
            if len(self._peers) >= MAX_CONNECTIONS:
                self._drop_idle_peers()
            peer = self._peers[identity] = Peer(identity, envelope)
        peer.envelope = envelope
        peer.last_seen = time.monotonic()
        return peer

    def _drop_idle_peers(self) -> None:
        """Forget the older half of the connections with nothing in flight."""
        idle = sorted((q for q in self._peers.values() if not q.requests and not q.backlog),
                      key=lambda q: q.last_seen)  # fmt: skip
        for q in idle[: max(1, len(idle) // 2)]:
            del self._peers[q.identity]

    def _on_hello(self, peer: Peer, hello: Hello) -> None:
        if self.api_key is not None and not hmac.compare_digest(
            (hello.api_key or "").encode(), self.api_key.encode()
        ):
            peer.welcomed = False
            self._send(peer, _error(p.UNAUTHORIZED, "invalid or missing api_key in hello"))
            return
        from paternoster import __version__

        peer.welcomed = True
        self._send(peer, p.message(
            p.WELCOME, server="paternoster", server_version=__version__,
            model=self.frontend.model_name, max_model_len=self.frontend.max_model_len,
            max_message_bytes=self.max_message_bytes, max_in_flight=self.max_in_flight,
            max_request_id_bytes=self.max_request_id_bytes,
        ))  # fmt: skip

    def _model_card(self) -> dict:
        return {"id": self.frontend.model_name, "max_model_len": self.frontend.max_model_len}

    # ------------------------------------------------------------- generate

    def _on_generate(self, peer: Peer, msg: Generate) -> None:
        rid = msg.id
        if rid in peer.requests:
            self._send(peer, _error(p.DUPLICATE_ID, f"request id {rid!r} is already in flight "
                                    "on this connection", "id", rid))  # fmt: skip
            return
        if len(peer.requests) >= self.max_in_flight:
            self._send(peer, _error(
                p.TOO_MANY_REQUESTS,
                f"this connection has {len(peer.requests)} requests in flight (limit "
                f"{self.max_in_flight})", request_id=rid,
            ))  # fmt: skip
            return
        if (msg.prompt is None) == (msg.prompt_token_ids is None):
            self._send(peer, _error(p.BAD_REQUEST, "give exactly one of prompt and "
                                    "prompt_token_ids", "prompt", rid))  # fmt: skip
            return
        task = asyncio.create_task(self._run(peer, msg))
        task.add_done_callback(lambda t: self._on_task_done(peer, rid, t))
        peer.requests[rid] = task

    def _send(self, peer: Peer, msg: dict) -> None:
        """Queue ``msg`` for ``peer`` without blocking (:meth:`Outbox.send`)."""
        self.outbox.send(peer, msg)

    def _on_task_done(self, peer: Peer, rid: str, task: asyncio.Task) -> None:
        """The final of a request whose task ended without sending one: cancelled
        before it first ran (an ``abort`` right behind its ``generate``)."""
        if peer.requests.get(rid) is not task:
            return  # it answered for itself, or the outbox failed or dropped it
        if task.cancelled():
            final = self._final(rid, None, None, "abort")
        else:  # _run catches everything; this is only a safety net
            final = _error(p.INTERNAL, "request ended without a result", request_id=rid)
        self._send(peer, final)
        peer.requests.pop(rid, None)

    async def _run(self, peer: Peer, msg: Generate) -> None:
        """One request from validation to its final message (exactly one, unless
        the request was taken from ``peer.requests`` by :meth:`Outbox.fail_slow` or
        :meth:`Outbox.on_gone`, which answer for it)."""
        rid = msg.id
        gen: Generation | None = None
        final: dict
        try:
            gen = await self._start(msg)
            final = _error(p.INTERNAL, "request ended without a result", request_id=rid)
            async with contextlib.aclosing(gen.deltas()) as deltas:
                async for d in deltas:
                    if d.finish_reason is not None:
                        final = self._final(rid, gen, d if msg.stream else None)
                        break
                    if msg.stream and (d.text or d.token_ids):
                        self._send(peer, _delta(rid, d))
        except asyncio.CancelledError:  # abort message, or the server is closing
            final = self._final(rid, gen, None, "abort", msg.stream)
        except InvalidRequestError as e:
            final = _error(p.BAD_REQUEST, e.message, _sampling_param(e.param), rid)
        except EngineOverloadedError as e:
            final = _error(p.OVERLOADED, str(e), request_id=rid, retry_after=e.retry_after)
        except RequestRejectedError as e:
            final = _error(p.BAD_REQUEST, str(e), request_id=rid)
        except EngineDeadError as e:
            final = _error(p.ENGINE_UNAVAILABLE, f"engine is not running: {e}", request_id=rid)
        except Exception as e:
            logger.exception("request %s failed", rid)
            final = _error(p.INTERNAL, f"internal error: {type(e).__name__}", request_id=rid)
        finally:
            if gen is not None:  # deltas() released it, unless it never ran
                gen.release()
        if peer.requests.get(rid) is asyncio.current_task():
            self._send(peer, final)
            peer.requests.pop(rid, None)  # _send may have found the peer gone and cleared it

    async def _start(self, msg: Generate) -> Generation:
        """Hand ``msg`` to the pipeline (the request's waiting-queue room is
        reserved; the generation holds the reservation).

        Raises:
            InvalidRequestError: a bad prompt or sampling field.
            EngineDeadError: the engine is down or shutting down.
            EngineOverloadedError: the waiting queue is full (nothing reserved).
        """
        if msg.prompt is not None:
            prompts, param = [msg.prompt], "prompt"
        else:
            prompts, param = [msg.prompt_token_ids or []], "prompt_token_ids"
        options = RequestOptions(
            request_id_prefix="zmq", priority=msg.priority, cache_salt=msg.cache_salt,
            default_max_tokens=p.DEFAULT_MAX_TOKENS, add_special_tokens=msg.add_special_tokens,
            prompt_param=param, tenant=msg.tenant, slo_ttft_s=msg.slo_ttft_s,
            slo_itl_s=msg.slo_itl_s,
        )  # fmt: skip
        sub = await self.frontend.submit(prompts, msg.sampling.fields(), options)
        return sub.generation

    def _final(self, rid: str, gen: Generation | None, last: ChoiceDelta | None,
               reason: str | None = None, streamed: bool = False) -> dict:  # fmt: skip
        """The ``final`` message: the text and tokens not sent in a delta (with
        ``last``, the stream's last piece; without, everything unless
        ``streamed``), the finish reason (``reason`` overrides) and usage."""
        if gen is None:  # aborted before it reached the engine
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            return p.message(p.FINAL, id=rid, text="", token_ids=[], finish_reason=reason,
                             usage=usage)  # fmt: skip
        state = gen.states[0]
        prompt_tokens, completion_tokens = gen.num_prompt_tokens, gen.num_generated_tokens
        fields: dict[str, Any] = {}
        if last is not None:
            text, token_ids, lp = last.text, list(last.token_ids), last.logprobs
        elif streamed:
            text, token_ids, lp = "", [], None
        else:
            text, token_ids, lp = state.text, list(state.token_ids), state.logprobs
        if lp is not None:
            fields["logprobs"] = lp.to_wire()
        if state.prompt_logprobs is not None:
            fields["prompt_logprobs"] = state.prompt_logprobs.to_wire()
        return p.message(
            p.FINAL, id=rid, text=text, token_ids=token_ids,
            finish_reason=reason or state.finish_reason, stop_reason=state.stop_reason,
            usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                   "total_tokens": prompt_tokens + completion_tokens},
            **fields,
        )  # fmt: skip

# ------------------------------------------------------------------ messages


# The generate message's own fields (every other pipeline field is a sampling one).
_MESSAGE_FIELDS = frozenset({"prompt", "prompt_token_ids", "priority", "cache_salt", "tenant",
                             "slo_ttft_s", "slo_itl_s"})  # fmt: skip


def _sampling_param(param: str | None) -> str | None:
    """The protocol's name of a pipeline field: sampling fields sit in ``sampling``."""
    return param if param is None or param in _MESSAGE_FIELDS else f"sampling.{param}"


def _delta(rid: str, d: ChoiceDelta) -> dict:
    fields = {"logprobs": d.logprobs.to_wire()} if d.logprobs is not None else {}
    return p.message(p.DELTA, id=rid, text=d.text, token_ids=list(d.token_ids), **fields)

