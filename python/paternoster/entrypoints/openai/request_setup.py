"""What every generation endpoint keeps about one HTTP request while it
answers: the submitted generation, its id and time, the stream's usage
settings, and how a stream's chunks are encoded."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from paternoster.entrypoints.openai.protocol import UsageInfo
from paternoster.entrypoints.openai.sse import event
from paternoster.frontend.generation import Generation


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
