"""What every generation endpoint keeps about one HTTP request while it
answers: the submitted generation, its id and time, the stream's usage
settings, how a stream's chunks are encoded, and who the request is served for
(its tenant)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from paternoster.entrypoints.openai.errors import APIError
from paternoster.entrypoints.openai.protocol_outputs import UsageInfo
from paternoster.entrypoints.openai.sse import event
from paternoster.frontend.errors import InvalidRequestError
from paternoster.frontend.generation import Generation
from paternoster.frontend.processor import wire_tenant

TENANT_HEADER = "X-Tenant-Id"
"""The request header naming the tenant, for clients that cannot set the
body's ``user`` field; when both are given the header wins (a gateway in front
of the server sets it from its own authentication, whatever the body says)."""


def request_tenant(user: str | None, headers: Mapping[str, str]) -> tuple[str | None, str]:
    """The tenant an HTTP request is served for, and the field it came from.

    A non-empty :data:`TENANT_HEADER` header wins over the body's ``user``; an
    empty header or ``user`` counts as absent (as an empty ZeroMQ ``tenant``);
    neither gives ``None``, the one anonymous tenant. The name is validated by
    the request pipeline (:func:`~paternoster.frontend.processor.check_tenant`:
    1 to 256 printable characters, no space at either end, else a 400 naming
    the field). A ``user`` the header overrides is checked all the same: a
    bad value is refused, not silently dropped.

    Args:
        user: the body's OpenAI ``user`` field.
        headers: the request's headers (case-insensitive lookup, as Starlette's).
    Returns:
        ``(tenant, param)``: the name or ``None``, and ``"user"`` or the header's name.
    Raises:
        APIError: 400 naming ``user``, a bad ``user`` beside the header.
    """
    header = headers.get(TENANT_HEADER)
    if header:
        if user:
            try:
                wire_tenant(user, "user")
            except InvalidRequestError as e:
                raise APIError(400, str(e), "user") from None
        return header, TENANT_HEADER
    return (user or None), "user"


@dataclass
class Setup:
    """One HTTP request's generation and its response settings."""

    gen: Generation
    request_id: str
    created: int
    include_usage: bool
    continuous_usage: bool
    texts: list[str | None]


def usage(gen: Generation) -> UsageInfo:
    """Exact token counts: each prompt once, every generated token delivered."""
    prompt, completion = gen.num_prompt_tokens, gen.num_generated_tokens
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)  # fmt: skip


def chunk_encoder(model_cls: type, setup: Setup, model_name: str) -> Callable[..., str]:
    """A function ``(choices, usage=None) -> SSE event`` for one stream of
    ``model_cls`` chunks. ``usage`` is left out unless ``include_usage``;
    with ``continuous_usage_stats`` every chunk carries the usage so far."""

    def chunk(choices: list, usage_info: UsageInfo | None = None) -> str:
        if usage_info is None and setup.continuous_usage:
            usage_info = usage(setup.gen)
        c = model_cls(
            id=setup.request_id, created=setup.created, model=model_name,
            choices=choices, usage=usage_info,
        )  # fmt: skip
        data = c.model_dump()
        if not setup.include_usage:
            data.pop("usage")
        return event(json.dumps(data, ensure_ascii=False))

    return chunk
