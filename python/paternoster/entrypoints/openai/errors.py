"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from paternoster.entrypoints.openai.protocol import ErrorInfo, ErrorResponse

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class APIError(Exception):
    """An error to return as an OpenAI error response.

    Args:
        status: HTTP status code (400, 404, 500, 503).
        message: human-readable explanation.
        param: the request field at fault, if any.
    """

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The JSON body of an error response (a dict)."""
    info = ErrorInfo(message=message, type=_TYPES.get(status, "APIError"), param=param, code=status)
    return ErrorResponse(error=info).model_dump()


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """An OpenAI-shaped JSON error response with HTTP status ``status``."""
    return JSONResponse(error_body(status, message, param), status_code=status)


def bad_request(message: str, param: str | None = None) -> APIError:
    """An :class:`APIError` with status 400 (``BadRequestError``)."""
    return APIError(400, message, param)
