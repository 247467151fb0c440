"""The FastAPI app and the uvicorn runner of the OpenAI-compatible server.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
POST /tokenize and POST /detokenize (vLLM's shapes), GET /version,
GET /health (200, or 503 with the reason once the engine died), GET /stats
(the engine's latest heartbeat stats; for tests and dashboards), GET /metrics
(Prometheus text format; docs/metrics.md), GET /debug/timeline (the request
timeline as a Chrome/Perfetto trace, or ``?format=snapshot`` for the raw
snapshot; 404 when the server runs without ``--timeline-size``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Tag

from paternoster.entrypoints.engine_client import (
    EngineClient,
    EngineDeadError,
    TimelineUnavailableError,
)
from paternoster.entrypoints.openai.errors import APIError, error_response
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
from paternoster.entrypoints.openai.serving import ClientDisconnected, OpenAIServing
from paternoster.metrics.server import ServerMetrics

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
    404: {"model": ErrorResponse, "description": "unknown model"},
    503: {"model": ErrorResponse, "description": "the engine is not running"},
}


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
    client: EngineClient, tokenizer: Any, served_model_name: str, chat_template: str | None = None
) -> FastAPI:
    """Create the FastAPI app over a started engine client.

    Args:
        client: a started :class:`EngineClient` (its ``info`` is read).
        tokenizer: the model's Hugging Face tokenizer.
        served_model_name: the model id clients must use.
        chat_template: a Jinja chat template replacing the model's own
            (``--chat-template FILE``).
    Returns:
        The app (serve it with uvicorn); ``app.state.metrics`` is its
        :class:`ServerMetrics` (a registry of its own).
    """
    from paternoster import __version__

    app = FastAPI(title="Paternoster", version=__version__, docs_url=None, redoc_url=None)
    metrics = ServerMetrics(lambda: client.stats)
    client.add_iteration_listener(metrics.engine.observe_iteration_tokens)
    serving = OpenAIServing(
        client, tokenizer, served_model_name, metrics.requests, chat_template=chat_template
    )
    app.state.serving = serving
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

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

    @app.post("/tokenize", responses={400: _ERRORS[400], 404: _ERRORS[404]})
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """Token ids of a ``prompt``, or of chat ``messages`` through the chat template."""
        return serving.tokenize(body)

    @app.post("/detokenize", responses={400: _ERRORS[400], 404: _ERRORS[404]})
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        """The text of a list of token ids."""
        return serving.detokenize(body)

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

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 ``{"status": "ok"}``, or 503 with the reason the engine is down."""
        if client.is_alive:
            return JSONResponse({"status": "ok"})
        reason = client.dead_reason or "engine is not running"
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)

    @app.get("/stats")
    async def stats() -> JSONResponse:
        """Engine stats from the latest heartbeat (<= 0.5 s old) and the engine pid."""
        return JSONResponse(
            {
                "alive": client.is_alive,
                "dead_reason": client.dead_reason,
                "num_in_flight": client.num_in_flight,
                "engine_pid": client.pid,
                "scheduler": client.info.get("scheduler"),
                "engine": client.stats,
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
    async def debug_timeline(format: str = "chrome") -> Response:
        """The engine's request timeline (docs/metrics.md): ``format=chrome`` (default)
        a Chrome/Perfetto trace, ``format=snapshot`` the raw snapshot. 404 when
        timelines are off, 503 when the engine is down, 400 for another format."""
        if format not in ("chrome", "snapshot"):
            raise APIError(400, "format must be 'chrome' or 'snapshot'", "format")
        try:
            snapshot = await client.timeline()
        except TimelineUnavailableError as e:
            raise APIError(404, str(e)) from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(503, f"engine unavailable: {e}") from None
        # A full ring buffer is megabytes of JSON: build it off the event loop.
        body = await asyncio.to_thread(_timeline_body, snapshot, format)
        return Response(body, media_type="application/json")

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
