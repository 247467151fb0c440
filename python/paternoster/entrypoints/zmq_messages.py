"""Typed decoding of the client protocol's incoming messages (docs/protocol.md,
"Client protocol").

Each message is one msgspec Struct, converted strictly from the decoded
msgpack map: no coercion (``"5"`` is not an int, ``1`` is not a bool), no
unknown keys (a misspelt ``temprature`` is an error, not a silent default).
A ``generate``'s ``sampling`` map has every :class:`SamplingParams` field but
``n``, derived from :class:`SamplingParams` itself (a new sampling field
reaches the protocol without an edit here); ranges are checked by the
request pipeline. :func:`parse` turns every failure into
:class:`MessageError`, whose ``code`` and ``param`` go back to the client in
an ``error`` message.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any

import msgspec

from paternoster.client import protocol as p
from paternoster.sampling_params import SamplingParams, request_fields

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


class _Message(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of the client messages."""


RequestId = Annotated[str, msgspec.Meta(min_length=1)]
Int64 = Annotated[int, msgspec.Meta(ge=-_INT64, le=_INT64 - 1)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=_INT64 - 1)]

# msgpack maps have string keys only: token-keyed maps travel as [key, value] pairs.
_WIRE_TYPES: dict[str, Any] = {"logit_bias": list[tuple[TokenId, float]] | None}


def _wire_type(name: str, hint: Any) -> Any:
    """The wire type of a :class:`SamplingParams` field: 64-bit integers, token
    ids >= 0, pairs for token-keyed maps; always optional (absent: default)."""
    if name in _WIRE_TYPES:
        return _WIRE_TYPES[name]
    base = hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if len(args) == 1 else hint
    if base is int:
        return Int64 | None
    if typing.get_origin(base) is list and typing.get_args(base) == (int,):
        return list[TokenId] | None
    return base | None


def _sampling_struct() -> type[msgspec.Struct]:
    hints = typing.get_type_hints(SamplingParams)
    fields = [(name, _wire_type(name, hints[name]), None)
              for name in request_fields() if name != "n"]  # fmt: skip

    def to_fields(self: Any) -> dict[str, Any]:
        """The :class:`SamplingParams` fields the message set (others: default)."""
        out = {name: value for name in self.__struct_fields__
               if (value := getattr(self, name)) is not None}  # fmt: skip
        if "logit_bias" in out:
            out["logit_bias"] = {int(t): b for t, b in out["logit_bias"]}
        return out

    return msgspec.defstruct(
        "WireSampling", fields, bases=(_Message,), namespace={"fields": to_fields},
        module=__name__,
    )  # fmt: skip


WireSampling = _sampling_struct()
"""A generate message's ``sampling`` map: the :class:`SamplingParams` fields
(``n`` excluded: one request, one sequence), each optional."""


class Hello(_Message):
    """``hello``: the handshake (protocol version in ``v``, optional API key)."""

    v: int
    type: str
    api_key: str | None = None
    client: Annotated[str, msgspec.Meta(max_length=256)] | None = None


class Generate(_Message):
    """``generate``: one request, a prompt as text or token ids.

    ``slo_ttft_s`` / ``slo_itl_s`` are the request's latency targets in
    seconds (the ``slo`` scheduler); their range (a finite number > 0) is
    checked by the request pipeline, as for HTTP. So is ``tenant``, by the
    HTTP ``user`` rule (:func:`~paternoster.frontend.processor.wire_tenant`:
    ``""`` is the anonymous tenant, a name is 1 to 256 printable characters).
    """

    v: int
    type: str
    id: RequestId
    prompt: str | None = None
    prompt_token_ids: list[TokenId] | None = None
    sampling: WireSampling = msgspec.field(default_factory=WireSampling)
    priority: Int64 = 0
    stream: bool = True
    add_special_tokens: bool = True
    cache_salt: str | None = None
    tenant: str | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None


class Abort(_Message):
    """``abort``: end a request of this connection (unknown ids are ignored)."""

    v: int
    type: str
    id: RequestId


class Query(_Message):
    """``models`` and ``health``: an optional ``id`` is echoed in the reply."""

    v: int
    type: str
    id: str | None = None


_MODELS = {p.HELLO: Hello, p.GENERATE: Generate, p.ABORT: Abort, p.MODELS: Query,
           p.HEALTH: Query}  # fmt: skip


def parse(msg: dict[str, Any], max_request_id_bytes: int = p.MAX_REQUEST_ID_BYTES) -> _Message:
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
        return msgspec.convert(msg, type=model, strict=True)
    except msgspec.ValidationError as e:
        raise MessageError(p.BAD_REQUEST, str(e), _param(str(e)), rid) from None


def _id_fits(rid: str, limit: int) -> bool:
    try:
        return len(rid.encode("utf-8")) <= limit
    except UnicodeEncodeError:
        return False


_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param(message: str) -> str | None:
    """The dotted field path a msgspec validation message names: its
    ``- at `$.a.b[0]``` location up to the first index, plus the field named
    as unknown or missing."""
    m = _AT.search(message)
    path = m.group(1).split("[", 1)[0] if m else ""
    named = _UNKNOWN.search(message) or _MISSING.search(message)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return path or None
