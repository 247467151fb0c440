"""Per-request limits and access control of the HTTP server: :class:`ServerLimits`
and the ASGI middleware that checks the API key (401) and the body size (413)
in front of every route."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paternoster.entrypoints.openai.errors import error_body
from paternoster.frontend.processor import DEFAULT_MAX_STOP
from paternoster.metrics.requests import DEFAULT_MAX_TENANTS
from paternoster.sampling_params import MAX_N

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# Routes open without the API key: liveness probes and Prometheus scrapes.
_OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})


@dataclass(frozen=True)
class ServerLimits:
    """Per-request limits and access control of the HTTP server.

    Attributes:
        api_key: the key clients must send as ``Authorization: Bearer KEY``
            (``None``: no authentication).
        max_body_bytes: largest request body in bytes (413 beyond).
        max_n: largest ``n`` (choices per prompt), at most ``MAX_N``
            (checked by the request pipeline, for every protocol).
        max_stop: most ``stop`` strings per request (likewise).
        metrics_max_tenants: distinct tenants that get a ``tenant`` label of
            their own in the per-tenant metrics (later ones count under
            ``"other"``).
    """

    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_n: int = MAX_N
    max_stop: int = DEFAULT_MAX_STOP
    metrics_max_tenants: int = DEFAULT_MAX_TENANTS

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {self.max_n}")
        if self.max_stop < 0:
            raise ValueError(f"max_stop must be >= 0, got {self.max_stop}")
        if self.metrics_max_tenants < 0:
            raise ValueError(f"metrics_max_tenants must be >= 0, got {self.metrics_max_tenants}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")


class GuardMiddleware:
    """ASGI middleware in front of every route: the API key check (401) and the
    body size limit (413, from ``Content-Length`` or while the body arrives;
    the body is buffered, then replayed to the app).

    Args:
        app: the wrapped ASGI app.
        limits: the key and the size limit.
    """

    def __init__(self, app: ASGIApp, limits: ServerLimits):
        self.app = app
        self.limits = limits
        key = limits.api_key
        self._expected = f"Bearer {key}".encode() if key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self._expected is not None and scope.get("path") not in _OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _send_error(send, 401, "Invalid or missing API key "
                                  "(send 'Authorization: Bearer KEY')")  # fmt: skip
                return
        limit = self.limits.max_body_bytes
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await _send_error(send, 413, f"request body is larger than {limit} bytes")
            return
        body = bytearray()
        while True:  # buffer the body so that an oversized chunked one is refused too
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if len(body) > limit:
                await _send_error(send, 413, f"request body is larger than {limit} bytes")
                return
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _send_error(send: Send, status: int, message: str) -> None:
    """Send an OpenAI-shaped JSON error straight through ASGI."""
    payload = json.dumps(error_body(status, message), separators=(",", ":")).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": payload})
