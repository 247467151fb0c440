"""Typed decoding of the client protocol's incoming messages (docs/protocol.md,
"Client protocol").

A decoded msgpack map is validated by a strict pydantic model: no coercion
(``"5"`` is not an int, ``1`` is not a bool), no unknown keys (a misspelt
``temprature`` is an error, not a silent default). :func:`parse` turns every
failure into :class:`MessageError`, whose ``code`` and ``param`` go back to the
client in an ``error`` message.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from paternoster.client import protocol as p

_INT64 = 2**63


class MessageError(ValueError):
    """An incoming message the server refuses.

    Attributes:
        code: an error code of :mod:`paternoster.client.protocol`.
        param: the offending field (dotted path), when there is one.
        request_id: the message's ``id`` when it had a usable one.
    """

    def __init__(self, code: str, message: str, param: str | None = None,
                 request_id: str | None = None):  # fmt: skip
        super().__init__(message)
        self.code = code
        self.param = param
        self.request_id = request_id


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


RequestId = Annotated[str, StringConstraints(min_length=1)]
Int64 = Annotated[int, Field(ge=-_INT64, lt=_INT64)]
TokenId = Annotated[int, Field(ge=0, lt=_INT64)]


class Hello(_Strict):
    """``hello``: the handshake (protocol version in ``v``, optional API key)."""

    v: int
    type: str
    api_key: str | None = None
    client: str | None = Field(default=None, max_length=256)


class WireSampling(_Strict):
    """A generate message's ``sampling`` map: :class:`SamplingParams` fields
    (``n`` excluded: one request, one sequence). Ranges are checked by
    :class:`SamplingParams` itself; this model checks types."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Int64 = -1
    min_p: float = 0.0
    seed: Int64 | None = None
    max_tokens: Int64 | None = 16
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: Int64 = 0
    logit_bias: list[tuple[TokenId, float]] | None = None
    logprobs: Int64 | None = None
    prompt_logprobs: Int64 | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        """msgpack has no tuples: each ``[token_id, bias]`` arrives as a list."""
        if isinstance(value, list):
            return [tuple(v) if isinstance(v, list) and len(v) == 2 else v for v in value]
        return value


class Generate(_Strict):
    """``generate``: one request, a prompt as text or token ids."""

    v: int
    type: str
    id: RequestId
    prompt: str | None = None
    prompt_token_ids: list[TokenId] | None = None
    sampling: WireSampling = Field(default_factory=WireSampling)
    priority: Int64 = 0
    stream: bool = True
    add_special_tokens: bool = True


class Abort(_Strict):
    """``abort``: end a request of this connection (unknown ids are ignored)."""

    v: int
    type: str
    id: RequestId


class Query(_Strict):
    """``models`` and ``health``: an optional ``id`` is echoed in the reply."""

    v: int
    type: str
    id: str | None = None


_MODELS = {p.HELLO: Hello, p.GENERATE: Generate, p.ABORT: Abort, p.MODELS: Query,
           p.HEALTH: Query}  # fmt: skip


def parse(msg: dict[str, Any], max_request_id_bytes: int = p.MAX_REQUEST_ID_BYTES) -> _Strict:
    """Validate a decoded map as one of the client messages.

    Args:
        msg: a map with string keys (from :func:`paternoster.engine.codec.unpack`).
        max_request_id_bytes: the longest ``id`` in UTF-8 bytes.
    Returns:
        A :class:`Hello`, :class:`Generate`, :class:`Abort` or :class:`Query`.
    Raises:
        MessageError: ``unsupported_version`` (``v`` missing or not spoken),
            ``malformed_message`` (no string ``type``), ``unknown_type``, or
            ``bad_request`` naming the field at fault; ``request_id`` is set
            when the map had a string ``id`` within the size limit.
    """
    rid = msg.get("id")
    rid = rid if isinstance(rid, str) and _id_fits(rid, max_request_id_bytes) else None
    version = msg.get("v")
    if type(version) is not int or version not in p.SUPPORTED_VERSIONS:
        raise MessageError(
            p.UNSUPPORTED_VERSION,
            f"protocol version {version!r} is not supported; this server speaks "
            f"{list(p.SUPPORTED_VERSIONS)}", "v", rid,
        )  # fmt: skip
    kind = msg.get("type")
    if not isinstance(kind, str):
        raise MessageError(p.MALFORMED_MESSAGE, "message has no string 'type'", "type", rid)
    model = _MODELS.get(kind)
    if model is None:
        raise MessageError(
            p.UNKNOWN_TYPE, f"unknown message type {kind[:64]!r}; known: {sorted(_MODELS)}",
            "type", rid,
        )  # fmt: skip
    if isinstance(msg.get("id"), str) and rid is None:
        raise MessageError(
            p.BAD_REQUEST, f"id must be at most {max_request_id_bytes} UTF-8 bytes", "id"
        )
    try:
        return model.model_validate(msg)
    except ValidationError as e:
        message, param = _first_error(e)
        raise MessageError(p.BAD_REQUEST, message, param, rid) from None


def _id_fits(rid: str, limit: int) -> bool:
    try:
        return len(rid.encode("utf-8")) <= limit
    except UnicodeEncodeError:
        return False


def _first_error(e: ValidationError) -> tuple[str, str | None]:
    """One readable line and the dotted field path from pydantic's errors."""
    errors = e.errors(include_url=False)
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ())]
    # tuple/list positions are not fields: keep the path up to the first index
    path = []
    for part in loc:
        if part.isdigit():
            break
        path.append(part)
    param = ".".join(path) or None
    msg = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
    text = f"{'.'.join(loc)}: {msg}" if loc else msg
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more errors)"
    return text, param
