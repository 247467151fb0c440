"""Names and limits of the public ZeroMQ/msgpack client protocol (docs/protocol.md,
"Client protocol"), shared by the server (:mod:`paternoster.entrypoints.zmq_server`)
and the clients in this package.

A client's DEALER socket talks to the server's ROUTER socket. Each message is
one ZeroMQ frame holding one msgpack map with string keys, ``"v"`` (the
protocol version) and ``"type"``. Nothing else is ever accepted on the socket:
no pickle, no msgpack ext types.
"""

from __future__ import annotations

from typing import Any

from paternoster.sampling_params import request_fields

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # larger frames get ``message_too_large``
MAX_REQUEST_ID_BYTES = 256  # UTF-8 bytes of a client-chosen request id
DEFAULT_MAX_IN_FLIGHT = 1024  # generate requests in flight per client connection

# Client -> server message types.
HELLO = "hello"
GENERATE = "generate"
ABORT = "abort"
MODELS = "models"
HEALTH = "health"

# Server -> client message types.
WELCOME = "welcome"
DELTA = "delta"
FINAL = "final"
ERROR = "error"
# MODELS and HEALTH replies use their request's type.

# Error codes (``error`` messages' ``code``).
MALFORMED_MESSAGE = "malformed_message"  # not a msgpack map with string keys, or no "type"
MESSAGE_TOO_LARGE = "message_too_large"
UNSUPPORTED_VERSION = "unsupported_version"
HANDSHAKE_REQUIRED = "handshake_required"
UNAUTHORIZED = "unauthorized"
UNKNOWN_TYPE = "unknown_type"
BAD_REQUEST = "bad_request"  # a field is missing, of the wrong type or out of range
DUPLICATE_ID = "duplicate_id"
TOO_MANY_REQUESTS = "too_many_requests"  # this connection's in-flight limit
OVERLOADED = "overloaded"  # the server's waiting queue is full; retry after retry_after s
ENGINE_UNAVAILABLE = "engine_unavailable"  # engine dead, restarting or shutting down
SLOW_CLIENT = "slow_client"  # the client did not read its messages in time
INTERNAL = "internal"

ERROR_CODES = (
    MALFORMED_MESSAGE, MESSAGE_TOO_LARGE, UNSUPPORTED_VERSION, HANDSHAKE_REQUIRED, UNAUTHORIZED,
    UNKNOWN_TYPE, BAD_REQUEST, DUPLICATE_ID, TOO_MANY_REQUESTS, OVERLOADED, ENGINE_UNAVAILABLE,
    SLOW_CLIENT, INTERNAL,
)  # fmt: skip

DEFAULT_MAX_TOKENS = 16  # a generate without sampling.max_tokens (capped by the context)

# The fields of a generate message's "sampling" map (all optional): every
# SamplingParams field but n (one request, one sequence).
SAMPLING_FIELDS = tuple(f for f in request_fields() if f != "n")


def message(type_: str, **fields: Any) -> dict:
    """A protocol message ``{"v": PROTOCOL_VERSION, "type": type_, **fields}``;
    fields whose value is ``None`` are left out."""
    return {"v": PROTOCOL_VERSION, "type": type_, **{k: v for k, v in fields.items()
                                                     if v is not None}}  # fmt: skip
