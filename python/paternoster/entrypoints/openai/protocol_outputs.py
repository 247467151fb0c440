"""Pydantic models of what the generation endpoints of the OpenAI-compatible
API return: /v1/completions and /v1/chat/completions responses, their SSE
chunks, logprobs and token usage."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

from paternoster.entrypoints.openai.protocol_tools import ToolCallOut


class UsageInfo(BaseModel):
    """Token counts: prompt (once per prompt) and generated (all choices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """Legacy completions ``logprobs``: per token its text, log-probability,
    the top alternatives (``{token text: logprob}``, the token itself
    included) and its character offset in the choice's text. The first prompt
    token of an ``echo`` has ``None`` for both."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One choice of a completion or completion chunk."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
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


class TopLogprob(BaseModel):
    """An alternative token at a position of a chat ``logprobs.content`` entry."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    """One generated token of a chat choice with its top alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """Chat ``choices[].logprobs``."""

    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(BaseModel):
    """The generated message of a chat choice: ``content`` is null when the
    model only called tools; ``tool_calls`` is empty when it called none;
    ``reasoning_content`` and ``reasoning`` (the same text, vLLM's older and
    newer names) hold what ``--reasoning-parser`` split off."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
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
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    """One choice of a chat chunk."""

    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE chunk of /v1/chat/completions."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
