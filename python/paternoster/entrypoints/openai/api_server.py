"""The FastAPI app and the uvicorn runner of the OpenAI-compatible server.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models,
GET /health (200, or 503 with the reason once the engine died), GET /stats
(the engine's latest heartbeat stats; for tests and dashboards), GET /metrics
(Prometheus text format; docs/metrics.md).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from paternoster.entrypoints.engine_client import EngineClient
from paternoster.entrypoints.openai.errors import APIError, error_response
from paternoster.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from paternoster.entrypoints.openai.serving import ClientDisconnected, OpenAIServing
from paternoster.metrics import ServerMetrics

logger = logging.getLogger("paternoster.server")


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


def build_app(client: EngineClient, tokenizer: Any, served_model_name: str) -> FastAPI:
    """Create the FastAPI app over a started engine client.

    Args:
        client: a started :class:`EngineClient` (its ``info`` is read).
        tokenizer: the model's Hugging Face tokenizer.
        served_model_name: the model id clients must use.
    Returns:
        The app (serve it with uvicorn); ``app.state.metrics`` is its
        :class:`ServerMetrics` (a registry of its own).
    """
    app = FastAPI(title="Paternoster", docs_url=None, redoc_url=None)
    metrics = ServerMetrics(lambda: client.stats)
    client.add_iteration_listener(metrics.engine.observe_iteration_tokens)
    serving = OpenAIServing(client, tokenizer, served_model_name, metrics.requests)
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

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        """OpenAI text completions (JSON or SSE when ``stream``)."""
        return await serving.create_completion(body, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        """OpenAI chat completions through the model's chat template."""
        return await serving.create_chat_completion(body, raw)

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

    return app
