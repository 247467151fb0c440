"""What the sync and asyncio clients share: request building, result types,
errors, and the socket set-up (docs/protocol.md, "Client protocol")."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import zmq

from paternoster.client import protocol as p
from paternoster.engine import codec

_ids = itertools.count()


class ClientError(Exception):
    """An ``error`` message from the server.

    Attributes:
        code: the error code (:mod:`paternoster.client.protocol`, e.g. ``bad_request``).
        message: the server's explanation.
        param: the field at fault, when there is one (e.g. ``sampling.temperature``).
        request_id: the request it ends, when it ends one.
    """

    def __init__(self, code: str, message: str, param: str | None = None,
                 request_id: str | None = None):  # fmt: skip
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.param = param
        self.request_id = request_id


class BadRequestError(ClientError):
    """The server refused the request's content (``bad_request``, ``duplicate_id``)."""


class OverloadedError(ClientError):
    """The server's waiting queue is full (``overloaded``) or this connection has
    too many requests in flight (``too_many_requests``). ``retry_after`` is in s."""

    def __init__(self, *args: Any, retry_after: float | None = None):
        super().__init__(*args)
        self.retry_after = retry_after


class EngineUnavailableError(ClientError):
    """The engine is dead, restarting or the server is shutting down."""


class ProtocolError(ClientError):
    """The server could not read a message, the versions differ, or the
    handshake failed (``unauthorized``: wrong API key)."""


_ERROR_CLASSES = {
    p.BAD_REQUEST: BadRequestError, p.DUPLICATE_ID: BadRequestError,
    p.OVERLOADED: OverloadedError, p.TOO_MANY_REQUESTS: OverloadedError,
    p.ENGINE_UNAVAILABLE: EngineUnavailableError,
}  # fmt: skip


def error_from(msg: dict) -> ClientError:
    """The :class:`ClientError` subclass for an ``error`` message."""
    code = str(msg.get("code", p.INTERNAL))
    cls = _ERROR_CLASSES.get(code, ProtocolError)
    args = (code, str(msg.get("message", "")), msg.get("param"), msg.get("id"))
    if cls is OverloadedError:
        return OverloadedError(*args, retry_after=msg.get("retry_after"))
    return cls(*args)


@dataclass
class Usage:
    """Token counts of one request (tokens)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass
class Delta:
    """One piece of a streamed request, in order. The last has ``finish_reason``
    (``stop``, ``length`` or ``abort``), ``stop_reason`` and ``usage`` set.

    Attributes:
        request_id: the request's id.
        text: new text (may be empty while text is held back).
        token_ids: new token ids.
        logprobs: ``[token_logprobs, top_token_ids, top_logprobs]`` of ``token_ids``
            when the request asked for ``logprobs``.
    """

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    usage: Usage | None = None
    logprobs: list | None = None


@dataclass
class Completion:
    """The result of a request run to its end.

    Attributes:
        request_id: the request's id.
        text: the generated text (without the stop string, unless asked).
        token_ids: every generated token, including a final EOS/stop token.
        finish_reason: ``stop``, ``length`` or ``abort``.
        stop_reason: the stop string or stop token id that ended it, if any.
        usage: token counts.
        logprobs: ``[token_logprobs, top_token_ids, top_logprobs]`` (when asked).
        prompt_logprobs: the same for prompt tokens ``1..P-1`` (when asked).
    """

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | str | None = None
    usage: Usage = field(default_factory=Usage)
    logprobs: list | None = None
    prompt_logprobs: list | None = None


_REQUEST_FIELDS = ("cache_salt", "tenant", "slo_ttft_s", "slo_itl_s")
"""Keyword arguments of ``generate`` sent as the message's own fields, not in ``sampling``."""


def generate_message(
    prompt: str | None, prompt_token_ids: list[int] | None, request_id: str | None,
    stream: bool, priority: int, add_special_tokens: bool, sampling: dict[str, Any],
) -> tuple[str, dict]:
    """A ``generate`` message and its id (``request_id`` or a fresh unique one).
    ``sampling`` may also hold ``cache_salt`` (prefix-cache isolation),
    ``tenant`` (who the request is served for, for the ``fair`` scheduler) and
    ``slo_ttft_s`` / ``slo_itl_s`` (latency targets in seconds, for the ``slo``
    scheduler), each sent as the message's own field (``None``: left out).

    Raises:
        ValueError: neither or both of ``prompt`` and ``prompt_token_ids``, or an
            unknown sampling field (the names are :data:`protocol.SAMPLING_FIELDS`).
    """
    if (prompt is None) == (prompt_token_ids is None):
        raise ValueError("give exactly one of prompt and prompt_token_ids")
    sampling = dict(sampling)
    request_fields = {k: sampling.pop(k) for k in _REQUEST_FIELDS if k in sampling}
    unknown = sorted(set(sampling) - set(p.SAMPLING_FIELDS))
    if unknown:
        raise ValueError(f"unknown sampling fields {unknown}; known: {list(p.SAMPLING_FIELDS)}")
    bias = sampling.get("logit_bias")
    if isinstance(bias, dict):  # {token id: bias}: msgpack map keys must be strings
        sampling = {**sampling, "logit_bias": [[int(t), float(b)] for t, b in bias.items()]}
    rid = request_id if request_id is not None else f"c{os.getpid()}-{next(_ids)}"
    fields: dict[str, Any] = {"id": rid, "stream": stream, "priority": priority,
                              "sampling": {k: v for k, v in sampling.items() if v is not None}}
    fields.update((k, v) for k, v in request_fields.items() if v is not None)
    if prompt is not None:
        fields["prompt"] = prompt
        fields["add_special_tokens"] = add_special_tokens
    else:
        fields["prompt_token_ids"] = [int(t) for t in prompt_token_ids]
    return rid, p.message(p.GENERATE, **fields)


def delta_from(msg: dict) -> Delta:
    """A :class:`Delta` from a ``delta`` or ``final`` message."""
    usage = msg.get("usage")
    return Delta(
        msg["id"], msg.get("text", ""), list(msg.get("token_ids", [])),
        msg.get("finish_reason"), msg.get("stop_reason"),
        Usage(**usage) if isinstance(usage, dict) else None, msg.get("logprobs"),
    )  # fmt: skip


class Accumulator:
    """Joins a request's deltas and final into a :class:`Completion`."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list | None = None

    def add(self, msg: dict) -> Completion | None:
        """Take a ``delta`` or ``final``; the :class:`Completion` after the final."""
        self.text.append(msg.get("text", ""))
        self.token_ids.extend(msg.get("token_ids", []))
        lp = msg.get("logprobs")
        if lp is not None:
            if self.logprobs is None:
                self.logprobs = [[], [], []]
            for mine, more in zip(self.logprobs, lp):
                mine.extend(more)
        if msg["type"] != p.FINAL:
            return None
        usage = msg.get("usage")
        return Completion(
            self.request_id, "".join(self.text), self.token_ids, msg.get("finish_reason", ""),
            msg.get("stop_reason"), Usage(**usage) if isinstance(usage, dict) else Usage(),
            self.logprobs, msg.get("prompt_logprobs"),
        )  # fmt: skip


def pack(msg: dict) -> bytes:
    """One message as a msgpack frame (the server's own codec).

    Raises:
        CodecError: a value msgpack cannot hold (a ``ValueError``).
    """
    return codec.encode(msg)


def unpack(frame: bytes, max_bytes: int) -> dict:
    """Decode a frame from the server (size checked first, ext types refused).

    Raises:
        ProtocolError: not a msgpack map with string keys and a string
            ``type``, or larger than ``max_bytes``.
    """
    try:
        msg = codec.unpack(frame, max_bytes)
    except codec.CodecError as e:
        raise ProtocolError(p.MALFORMED_MESSAGE, f"unreadable server message: {e}") from None
    if not isinstance(msg.get("type"), str):
        raise ProtocolError(p.MALFORMED_MESSAGE, "server message has no string 'type'")
    return msg


def dealer(ctx: zmq.Context, address: str, max_message_bytes: int) -> zmq.Socket:
    """A client DEALER on ``ctx`` (no linger, incoming frames bounded by
    ``max_message_bytes``) connected to ``address``; ZeroMQ connects lazily,
    so no server needs to run yet.

    Raises:
        ValueError: ZeroMQ refuses ``address`` (not ``tcp://HOST:PORT`` or
            ``ipc://PATH``); ``ctx`` is terminated.
    """
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    try:
        sock.connect(address)
    except zmq.ZMQError as e:
        sock.close(0)
        ctx.term()
        raise ValueError(f"address must be a ZeroMQ endpoint such as tcp://127.0.0.1:5555 or "
                         f"ipc:///tmp/paternoster.ipc, got {address!r} ({e})") from None
    return sock


def hello_message(api_key: str | None, client_name: str | None) -> dict:
    """The ``hello`` handshake message."""
    return p.message(p.HELLO, api_key=api_key, client=client_name)


def no_server_message(address: str, timeout: float | None) -> str:
    """What a handshake timeout says: ZeroMQ connects lazily, so an address
    with no server behind it and a server too busy to answer look the same."""
    waited = "" if timeout is None else f" within {timeout:g} s"
    return (f"no Paternoster server answered the handshake at {address}{waited} "
            f"(is `paternoster serve --zmq-address {address}` running there?)")
