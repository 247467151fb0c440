"""The errors of the request pipeline, shared by every protocol mapping.

Each protocol maps them onto its own wire form: the OpenAI HTTP server onto
status codes with the OpenAI error body (docs/errors.md), the ZeroMQ client
protocol onto its error codes (docs/protocol.md). The pipeline itself never
speaks HTTP.
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the pipeline refuses before the engine sees it (HTTP 400,
    ZeroMQ ``bad_request``).

    Args:
        message: what is wrong, for the client.
        param: the request field at fault (a top-level name such as
            ``"max_tokens"``), or ``None``.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class EngineStartupError(RuntimeError):
    """The engine process did not become ready (bad model path, crash, timeout)."""


class EngineDeadError(RuntimeError):
    """The engine is not serving: it exited, stalled, is restarting, or the
    server is shutting down; the message says which (HTTP 503, ZeroMQ
    ``engine_unavailable``)."""


class EngineOverloadedError(RuntimeError):
    """Too many requests (or prompt tokens) are waiting for the engine, or a
    request waited longer than the queue timeout (HTTP 503 with
    ``Retry-After``, ZeroMQ ``overloaded``).

    Args:
        message: why.
        retry_after: the suggested wait in seconds.
    """

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class RequestRejectedError(ValueError):
    """The engine refused a request (``EngineCore.add_request`` raised
    ``ValueError``); the message says why (HTTP 400, ZeroMQ ``bad_request``)."""


class TimelineUnavailableError(RuntimeError):
    """The engine has no request timeline to give (timelines are off); the
    message says how to turn them on."""
