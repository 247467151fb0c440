"""Pydantic request and response models of the OpenAI-compatible API.

Requests ignore unknown fields (as OpenAI does); value ranges are checked
later through :class:`~paternoster.sampling_params.SamplingParams` so the
messages match the offline API's.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    """``stream_options``: ``include_usage`` adds a final chunk with usage."""

    include_usage: bool = False


class _SamplingFields(_Request):
    """Sampling fields shared by both endpoints (``None`` = default)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions body.

    ``prompt`` is a string, a list of strings, a list of token ids, or a list
    of token-id lists; several prompts give ``len(prompts) * n`` choices.
    """

    prompt: str | list[str] | list[int] | list[list[int]]


class TextPart(_Request):
    """A content part of a chat message (only ``text`` parts are supported)."""

    type: str = "text"
    text: str | None = None


class ChatMessage(_Request):
    """One chat message: ``role`` and ``content`` (string or text parts)."""

    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions body. ``max_completion_tokens`` wins over
    ``max_tokens``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


class UsageInfo(BaseModel):
    """Token counts: prompt (once per prompt) and generated (all choices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionChoice(BaseModel):
    """One choice of a completion or completion chunk."""

    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """Non-streaming /v1/completions response."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(BaseModel):
    """One SSE chunk of /v1/completions (``usage`` only in the final chunk
    when ``include_usage``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class AssistantMessage(BaseModel):
    """The generated message of a chat choice."""

    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    """Non-streaming /v1/chat/completions response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    """The ``delta`` of a chat chunk; unset fields are left out of the JSON."""

    role: str | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    """One choice of a chat chunk."""

    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE chunk of /v1/chat/completions."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    """An entry of GET /v1/models."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "paternoster"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    """GET /v1/models response."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    """The ``error`` object of an error response."""

    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """Every error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorInfo
