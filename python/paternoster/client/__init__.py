"""Clients of Paternoster's public ZeroMQ/msgpack protocol (docs/protocol.md,
"Client protocol"): :class:`Client` (blocking) and :class:`AsyncClient` (asyncio).

Talks to ``paternoster serve``'s ``--zmq-address`` with lower overhead than
HTTP; the protocol is plain msgpack maps over a DEALER socket, so clients in
other languages need only a ZeroMQ and a msgpack library.
"""

from paternoster.client._common import (
    BadRequestError,
    ClientError,
    Completion,
    Delta,
    EngineUnavailableError,
    OverloadedError,
    ProtocolError,
    Usage,
)
from paternoster.client.aio import AsyncClient
from paternoster.client.sync import Client, Stream

__all__ = [
    "AsyncClient", "BadRequestError", "Client", "ClientError", "Completion", "Delta",
    "EngineUnavailableError", "OverloadedError", "ProtocolError", "Stream", "Usage",
]  # fmt: skip
