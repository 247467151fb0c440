"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Every error the HTTP server returns has this body, whatever raised it (our
checks, pydantic validation, routing's 404/405, the body size limit, the API
key check). docs/errors.md lists the statuses and when each is returned.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import JSONResponse

from paternoster.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error to return as an OpenAI error response.

    Args:
        status: HTTP status code (400, 401, 404, 405, 413, 500, 503).
        message: human-readable explanation.
        param: the request field at fault, if any.
        headers: extra response headers (e.g. ``Retry-After`` on a 503).
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = dict(headers or {})


def error_type(status: int) -> str:
    """The ``error.type`` of an HTTP status (``"APIError"`` for an unlisted one)."""
    return _TYPES.get(status, "APIError")


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The JSON body of an error response (a dict)."""
    info = ErrorInfo(message=message, type=error_type(status), param=param, code=status)
    return ErrorResponse(error=info).model_dump()


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An OpenAI-shaped JSON error response with HTTP status ``status``."""
    return JSONResponse(
        error_body(status, message, param), status_code=status, headers=dict(headers or {})
    )


def bad_request(message: str, param: str | None = None) -> APIError:
    """An :class:`APIError` with status 400 (``BadRequestError``)."""
    return APIError(400, message, param)


# The OpenAPI description of each error status; every route declares those it can return.
ERROR_RESPONSES = {
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


def renamed_in_message(message: str, old: str | None, new: str | None) -> str:
    """``message`` with its leading field name ``old`` (the pipeline's name,
    e.g. ``max_tokens must be ...``) written as ``new``, the field the client
    sent (e.g. ``max_completion_tokens``); unchanged when it does not start
    with ``old``."""
    if old and new and old != new and message.startswith(old):
        return new + message[len(old):]
    return message
