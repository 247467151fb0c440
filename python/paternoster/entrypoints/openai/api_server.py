"""The FastAPI app and the uvicorn runner of the OpenAI-compatible server.

Routes: POST /v1/completions, POST /v1/chat/completions, POST /v1/responses
(stateless, mapped onto chat: responses.py), GET /v1/models (and /v1/models/{id}),
POST /tokenize and POST /detokenize (vLLM's shapes), GET /version,
GET /health (200 while an engine serves, or 503 with the reason once every
engine died; the body lists each engine), GET /stats (the engines' stats as of
their latest step, added up and per engine; for tests and dashboards), GET /metrics
(Prometheus text format; docs/metrics.md), POST /reset_prefix_cache (forget
the cached KV blocks), GET /debug/timeline (the request
timeline as a Chrome/Perfetto trace, or ``?format=snapshot`` for the raw
snapshot; 404 when the server runs without ``--timeline-size``).

Every error has the OpenAI shape (docs/errors.md), routing's 404/405 and
unparsable bodies included. With an API key, every route except /health,
/version and /metrics needs ``Authorization: Bearer KEY`` (401 otherwise).
Bodies over ``max_body_bytes`` get 413 before they are parsed.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Tag
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from paternoster.entrypoints.openai.errors import APIError, error_body, error_response
from paternoster.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from paternoster.entrypoints.openai.responses import create_response
from paternoster.entrypoints.openai.responses_protocol import ResponsesRequest
from paternoster.entrypoints.openai.serving import OpenAIServing
from paternoster.entrypoints.openai.sse import ClientDisconnected
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    TimelineUnavailableError,
)
from paternoster.frontend.pipeline import Frontend
from paternoster.metrics.server import ServerMetrics
from paternoster.sampling_params import MAX_N

logger = logging.getLogger("paternoster.server")


def _tokenize_kind(body: Any) -> str:
    return "messages" if isinstance(body, dict) and "messages" in body else "prompt"


# /tokenize takes a prompt or chat messages; the tag keeps error locations short.
TokenizeRequest = Annotated[
    Annotated[TokenizeCompletionRequest, Tag("prompt")]
    | Annotated[TokenizeChatRequest, Tag("messages")],
    Discriminator(_tokenize_kind),
]

_ERRORS = {
    400: {"model": ErrorResponse, "description": "bad input (the parameter is named)"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key (--api-key)"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body too large"},
    503: {
        "model": ErrorResponse,
        "description": "the engine is not running, the server is shutting down, or it is "
        "overloaded (with Retry-After)",
    },
}

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_STOP = 64
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
    """

    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_n: int = MAX_N
    max_stop: int = DEFAULT_MAX_STOP

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not 1 <= self.max_n <= MAX_N:
            raise ValueError(f"max_n must be in [1, {MAX_N}], got {self.max_n}")
        if self.max_stop < 0:
            raise ValueError(f"max_stop must be >= 0, got {self.max_stop}")
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
    payload = json.dumps(error_body(status, message)).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": payload})


def _generation_responses(model: type) -> dict:
    """OpenAPI responses of a generation route: JSON, or SSE chunks when ``stream``."""
    ok = {
        "model": model,
        "description": "the completion, or with `stream` a text/event-stream of chunks",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    return {200: ok, **_ERRORS}


def _timeline_body(snapshot: dict, fmt: str) -> bytes:
    """The JSON body of GET /debug/timeline: the snapshot, or its Chrome trace."""
    from paternoster.metrics.chrome_trace import to_chrome_trace

    return json.dumps(snapshot if fmt == "snapshot" else to_chrome_trace(snapshot)).encode()


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable line and the top-level parameter from pydantic's errors."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"Invalid JSON body: {first.get('msg', '')}", None
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    msg = first.get("msg", "invalid value")
    text = f"{'.'.join(loc)}: {msg}" if loc else msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more errors)"
    return text, param


def build_app(
    client: EngineClient | DataParallelClient,
    tokenizer: Any,
    served_model_name: str,
    chat_template: str | None = None,
    limits: ServerLimits | None = None,
    tool_parser: type | None = None,
    reasoning_parser: type | None = None,
    trust_request_chat_template: bool = False,
) -> FastAPI:
    """Create the FastAPI app over a started engine client.

    Args:
        client: a started :class:`DataParallelClient`, or a started
            :class:`EngineClient` (served as one engine).
        tokenizer: the model's Hugging Face tokenizer.
        served_model_name: the model id clients must use.
        chat_template: a Jinja chat template replacing the model's own
            (``--chat-template FILE``).
        limits: API key, body size and per-request limits (default: no key,
            16 MiB bodies, ``n`` <= 128, 64 stop strings).
        tool_parser: the ``--tool-call-parser`` class (a
            :class:`~paternoster.tool_parsers.ToolParser`), or ``None``.
        reasoning_parser: the ``--reasoning-parser`` class (a
            :class:`~paternoster.reasoning_parsers.ReasoningParser`), or ``None``.
        trust_request_chat_template: accept a request's own ``chat_template``.
    Returns:
        The app (serve it with uvicorn); ``app.state.metrics`` is its
        :class:`ServerMetrics` (a registry of its own).
    """
    from paternoster import __version__

    app = FastAPI(title="Paternoster", version=__version__, docs_url=None, redoc_url=None)
    if isinstance(client, EngineClient):
        client = DataParallelClient([client])
    metrics = ServerMetrics(client.engine_stats, client.num_engines)
    client.add_iteration_listener(metrics.engine.observe_iteration_tokens)
    limits = limits or ServerLimits()
    frontend = Frontend(client, tokenizer, served_model_name, metrics.requests, chat_template,
                        limits.max_n, limits.max_stop)  # fmt: skip
    serving = OpenAIServing(frontend, tool_parser, reasoning_parser, trust_request_chat_template)
    app.state.client = client
    app.state.frontend = frontend
    app.state.serving = serving
    app.state.metrics = metrics
    app.state.limits = limits
    app.add_middleware(GuardMiddleware, limits=limits)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing's 404/405 and body parse errors, in the OpenAI shape.
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(exc.status_code, message, headers=exc.headers)

    @app.exception_handler(EngineOverloadedError)
    async def _overloaded(_: Request, exc: EngineOverloadedError) -> JSONResponse:
        return error_response(503, str(exc), headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(ClientDisconnected)
    async def _disconnected(_: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return error_response(500, f"internal error: {type(exc).__name__}")

    @app.post(
        "/v1/completions", response_model=None,
        responses=_generation_responses(CompletionResponse),
    )  # fmt: skip
    async def completions(body: CompletionRequest, raw: Request):
        """OpenAI text completions (JSON or SSE when ``stream``)."""
        return await serving.create_completion(body, raw)

    @app.post(
        "/v1/chat/completions", response_model=None,
        responses=_generation_responses(ChatCompletionResponse),
    )  # fmt: skip
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        """OpenAI chat completions through the model's chat template."""
        return await serving.create_chat_completion(body, raw)

    @app.post("/v1/responses", response_model=None, responses=_ERRORS)
    async def responses(body: ResponsesRequest, raw: Request):
        """OpenAI Responses (stateless), mapped onto chat completions; SSE when ``stream``."""
        return await create_response(serving, body, raw)

    @app.post("/tokenize", responses={400: _ERRORS[400], 404: _ERRORS[404]})
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """Token ids of a ``prompt``, or of chat ``messages`` through the chat template."""
        return await serving.run_tokenizer(serving.tokenize, body)

    @app.post("/detokenize", responses={400: _ERRORS[400], 404: _ERRORS[404]})
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        """The text of a list of token ids."""
        return await serving.run_tokenizer(serving.detokenize, body)

    @app.get("/version")
    async def version() -> VersionResponse:
        """The server's version."""
        return VersionResponse(version=__version__)

    @app.get("/v1/models")
    async def models() -> ModelList:
        """The one served model."""
        card = ModelCard(
            id=served_model_name,
            root=client.info.get("model_dir"),
            max_model_len=serving.max_model_len,
        )
        return ModelList(data=[card])

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        """The served model by its id (OpenAI's retrieve); 404 for another id."""
        if model_id != served_model_name:
            raise APIError(404, f"The model `{model_id}` does not exist.", "model")
        return ModelCard(id=served_model_name, root=client.info.get("model_dir"),
                         max_model_len=serving.max_model_len)  # fmt: skip

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 ``{"status": "ok"}`` while at least one engine serves, or 503
        with the reason none can: dead, restarting, stalled (no heartbeat for
        ``--engine-stall-timeout`` seconds; 200 again once it resumes) or
        shutting down. ``engines`` gives each engine's ``status`` (and
        ``reason`` when it cannot serve)."""
        engines = [{"engine": i, "status": "ok"} if r is None else
                   {"engine": i, "status": "unhealthy", "reason": r}
                   for i, r in enumerate(c.unavailable_reason for c in client.engines)]  # fmt: skip
        reason = client.unavailable_reason
        if reason is None:
            return JSONResponse({"status": "ok", "engines": engines})
        return JSONResponse({"status": "unhealthy", "reason": reason, "engines": engines},
                            status_code=503)  # fmt: skip

    @app.get("/stats")
    async def stats() -> JSONResponse:
        """Frontend counters (live) and the engines' stats as of their latest
        ``outputs`` message (sent after every step) or heartbeat (every 0.5 s),
        whichever is newer, added up in ``engine``; plus engine 0's pid and
        thread count, and in ``engines`` each engine's state, pid, threads
        and stats; ``router`` counts requests routed by prefix affinity and by load."""
        return JSONResponse(
            {
                "alive": client.is_alive,
                "dead_reason": client.dead_reason,
                "unavailable_reason": client.unavailable_reason,
                "num_in_flight": client.num_in_flight,
                "num_waiting": client.num_waiting,
                "num_waiting_tokens": client.num_waiting_tokens,
                "num_reserved": client.num_reserved,
                "num_reserved_tokens": client.num_reserved_tokens,
                "engine_pid": client.pid,
                "scheduler": client.info.get("scheduler"),
                "num_threads": client.info.get("num_threads"),
                "engine": client.stats,
                "engines": client.describe_engines(),
                "router": {"affinity": client.router.num_affinity_routed,
                           "load": client.router.num_load_routed},
            }
        )

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format); see docs/metrics.md."""
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get(
        "/debug/timeline",
        responses={
            400: _ERRORS[400],
            404: {"model": ErrorResponse, "description": "timelines are off (--timeline-size 0)"},
            503: _ERRORS[503],
        },
    )
    async def debug_timeline(format: str = "chrome", engine: int = 0) -> Response:
        """An engine's request timeline (docs/metrics.md): ``format=chrome`` (default)
        a Chrome/Perfetto trace, ``format=snapshot`` the raw snapshot; ``engine``
        picks the data-parallel engine (default 0). 404 when timelines are off,
        503 when the engine is down, 400 for another format or engine."""
        if format not in ("chrome", "snapshot"):
            raise APIError(400, "format must be 'chrome' or 'snapshot'", "format")
        if not 0 <= engine < client.num_engines:
            raise APIError(400, f"engine must be in [0, {client.num_engines})", "engine")
        try:
            snapshot = await client.timeline(engine=engine)
        except TimelineUnavailableError as e:
            raise APIError(404, str(e)) from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(503, f"engine unavailable: {e}") from None
        # A full ring buffer is megabytes of JSON: build it off the event loop.
        body = await asyncio.to_thread(_timeline_body, snapshot, format)
        return Response(body, media_type="application/json")

    @app.post("/reset_prefix_cache", responses={400: _ERRORS[400], 503: _ERRORS[503]})
    async def reset_prefix_cache() -> JSONResponse:
        """Forget every cached KV block (vLLM's operator endpoint), e.g. to measure
        cold-cache latency; running requests keep their blocks. Returns
        ``{"num_blocks_reset": N}``; 400 when the engine has no prefix cache, 503
        when it is down."""
        try:
            n = await client.reset_prefix_cache()
        except ValueError as e:
            raise APIError(400, str(e)) from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(503, f"engine unavailable: {e}") from None
        return JSONResponse({"num_blocks_reset": n})

    app.openapi = lambda: _openapi_schema(app)  # FastAPI's documented override
    return app


def _openapi_schema(app: FastAPI) -> dict:
    """FastAPI's schema without its 422 responses: validation errors are 400
    with the OpenAI error body (declared per route)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema
