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
snapshot; 404 when the server runs without ``--timeline-size``). The last five,
the operator routes, are in routes_admin.py.

Every error has the OpenAI shape (docs/errors.md), routing's 404/405 and
unparsable bodies included. With an API key, every route except /health,
/version and /metrics needs ``Authorization: Bearer KEY`` (401 otherwise).
Bodies over ``max_body_bytes`` get 413 before they are parsed (both checks:
guard.py).
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Tag
from starlette.exceptions import HTTPException as StarletteHTTPException

from paternoster.entrypoints.openai.errors import ERROR_RESPONSES, APIError, error_response
from paternoster.entrypoints.openai.guard import GuardMiddleware, ServerLimits
from paternoster.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from paternoster.entrypoints.openai.protocol_outputs import (
    ChatCompletionResponse,
    CompletionResponse,
)
from paternoster.entrypoints.openai.responses import create_response
from paternoster.entrypoints.openai.responses_protocol import ResponsesRequest
from paternoster.entrypoints.openai.routes_admin import admin_router
from paternoster.entrypoints.openai.serving import OpenAIServing
from paternoster.entrypoints.openai.sse import ClientDisconnected
from paternoster.entrypoints.openai.validation_errors import describe_errors
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import EngineOverloadedError
from paternoster.frontend.pipeline import Frontend
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


def _generation_responses(model: type) -> dict:
    """OpenAPI responses of a generation route: JSON, or SSE chunks when ``stream``."""
    ok = {
        "model": model,
        "description": "the completion, or with `stream` a text/event-stream of chunks",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    return {200: ok, **ERROR_RESPONSES}


def _validation_message(exc: RequestValidationError,
                        content_type: str | None = None) -> tuple[str, str | None]:
    """One readable line and the parameter from pydantic's errors
    (:func:`describe_errors`: the real path, ``messages[0].content``); a body
    that was not read as JSON because ``content_type`` is not JSON (e.g.
    curl's default form type) is named as such."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"Invalid JSON body: {first.get('msg', '')}", None
    media = (content_type or "").split(";")[0].strip().lower()
    if tuple(first.get("loc", ())) == ("body",) and first.get("type") == "missing":
        return "The request body is empty: send a JSON object", None
    if (tuple(first.get("loc", ())) == ("body",) and media
            and not (media == "application/json" or media.endswith("+json"))):
        return (f"The request body must be JSON, sent with the header Content-Type: "
                f"application/json (got Content-Type: {media})"), None
    return describe_errors(errors, getattr(exc, "body", None))


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
    limits = limits or ServerLimits()
    metrics = ServerMetrics(client.engine_stats, client.num_engines, limits.metrics_max_tenants)
    client.add_iteration_listener(metrics.engine.observe_iteration_tokens)
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
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc, request.headers.get("content-type"))
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

    @app.post("/v1/responses", response_model=None, responses=ERROR_RESPONSES)
    async def responses(body: ResponsesRequest, raw: Request):
        """OpenAI Responses (stateless), mapped onto chat completions; SSE when ``stream``."""
        return await create_response(serving, body, raw)

    @app.post("/tokenize", responses={400: ERROR_RESPONSES[400], 404: ERROR_RESPONSES[404]})
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """Token ids of a ``prompt``, or of chat ``messages`` through the chat template."""
        return await serving.run_tokenizer(serving.tokenize, body)

    @app.post("/detokenize", responses={400: ERROR_RESPONSES[400], 404: ERROR_RESPONSES[404]})
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

    app.include_router(admin_router(client, metrics))


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
