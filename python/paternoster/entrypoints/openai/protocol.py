"""Pydantic request and response models of the OpenAI-compatible API: the
request bodies, and the bodies of /tokenize, /detokenize, /version, /v1/models
and errors. Tool calling's models are in protocol_tools.py, what the
generation endpoints return in protocol_outputs.py.

Requests ignore unknown fields (as OpenAI does) but their types are strict:
no coercion of ``"yes"`` or ``1`` to a boolean, of ``"5"`` to a number (an
integer is accepted where a float is expected); value ranges are checked
later through :class:`~paternoster.sampling_params.SamplingParams` so the
messages match the offline API's.
"""

from __future__ import annotations

import time
import typing
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from paternoster.entrypoints.openai.protocol_base import _Request, _SchedulingFields
from paternoster.entrypoints.openai.protocol_tools import ChatTool, NamedToolChoice, ToolCallItem
from paternoster.sampling_params import SamplingParams, request_fields


class StreamOptions(_Request):
    """``stream_options``: ``include_usage`` adds a final chunk with usage;
    ``continuous_usage_stats`` (vLLM, with ``include_usage``) also puts the
    usage so far in every chunk."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Request):
    """``response_format.json_schema``: OpenAI's named schema (``strict`` is
    accepted; the output always follows the schema)."""

    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    """``response_format``: ``text`` (no constraint), ``json_object`` (any
    JSON object) or ``json_schema`` (the ``json_schema.schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _OpenAIFields(_SchedulingFields):
    """Fields shared by both endpoints (``None`` = default): OpenAI's own and
    those whose HTTP form differs from :class:`SamplingParams` (``stop`` may
    be one string, ``logit_bias`` keys are strings). Every other
    :class:`SamplingParams` field is added by :func:`_with_sampling_fields`
    under its own name and type.

    Semantics follow vLLM where OpenAI is silent; ranges are checked by
    :class:`~paternoster.sampling_params.SamplingParams` (400 naming the field).
    """

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = 1
    best_of: int | None = Field(None, description="only 1 (or n = 1) is supported")
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float | None = Field(None, description="[-2, 2], over generated tokens")
    frequency_penalty: float | None = Field(None, description="[-2, 2], over generated tokens")
    repetition_penalty: float | None = Field(
        None, description="> 0 (1 = off), over prompt and generated tokens (HF semantics)"
    )
    min_tokens: int = Field(0, description="EOS and stop_token_ids are masked until reached")
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (as a string) -> bias in [-100, 100]"
    )
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with `stream: true`")
    response_format: ResponseFormat | None = Field(
        None, description="OpenAI's structured output: json_object or json_schema")
    guided_json: dict[str, Any] | str | None = Field(
        None, description="older vLLM name of structured_outputs.json")
    guided_regex: str | None = Field(
        None, description="older vLLM name of structured_outputs.regex")
    guided_choice: list[str] | None = Field(
        None, description="older vLLM name of structured_outputs.choice")
    guided_grammar: str | None = Field(
        None, description="older vLLM name of structured_outputs.grammar")
    cache_salt: str | None = Field(
        None, description="prefix-cache isolation: KV blocks are shared only between requests "
        "with the same salt (vLLM)",
    )

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo):
        """``stream_options`` without ``stream: true`` is a 400, as in vLLM."""
        if value is not None and info.data.get("stream") is False:
            raise PydanticCustomError(
                "stream_options", "Stream options can only be defined when `stream=True`."
            )
        return value


# Set per endpoint: completions' integer ``logprobs`` and chat's boolean one.
_PER_ENDPOINT = frozenset({"logprobs", "prompt_logprobs"})

SAMPLING_FIELDS = tuple(f for f in request_fields() if f not in _PER_ENDPOINT)
"""The :class:`SamplingParams` fields a request body carries under their own names."""


def _with_sampling_fields(base: type[BaseModel]) -> type[BaseModel]:
    """``base`` plus every :class:`SamplingParams` field it does not declare
    (optional, ``None`` = the default), so a new sampling field reaches the
    HTTP API without an edit here."""
    hints = typing.get_type_hints(SamplingParams)
    extra = {
        name: (hints[name] | None, None)
        for name in SAMPLING_FIELDS if name not in base.model_fields
    }  # fmt: skip
    return create_model("_SamplingFields", __base__=base, __module__=__name__, **extra)


_SamplingFields = _with_sampling_fields(_OpenAIFields)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions body.

    ``prompt`` is a string, a list of strings, a list of token ids, or a list
    of token-id lists; several prompts give ``len(prompts) * n`` choices.
    ``logprobs`` (0..20) returns each token's log-probability and that many
    alternatives; ``echo`` prepends the prompt (with its logprobs when
    ``logprobs`` is set; the first prompt token has none).
    """

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False


class TextPart(_Request):
    """A content part of a chat message (only ``text`` parts are supported)."""

    type: str = "text"
    text: str | None = None


class ChatMessage(_Request):
    """One chat message: ``role`` and ``content`` (string or text parts).

    An assistant message may carry the ``tool_calls`` it made (then ``content``
    may be null) and the ``reasoning_content`` it produced (``reasoning`` is
    vLLM's newer name for it); a ``tool`` message answers the call
    ``tool_call_id``.
    """

    role: Literal["system", "developer", "user", "assistant", "tool", "function", "ipython"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _ChatTemplateFields(_Request):
    """How ``messages`` become a prompt (shared by chat completions and /tokenize)."""

    add_generation_prompt: bool = Field(
        True, description="end the prompt with the assistant turn's header"
    )
    continue_final_message: bool = Field(
        False, description="leave the last (assistant) message open, to be continued"
    )
    add_special_tokens: bool = Field(
        False, description="let the tokenizer add BOS etc. (never a second BOS)"
    )
    chat_template: str | None = Field(None, description="a Jinja template overriding the model's")
    tools: list[ChatTool] | None = Field(
        None, description="functions the model may call; the chat template renders them")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="extra variables for the chat template (e.g. enable_thinking)")


class ChatCompletionRequest(_ChatTemplateFields, _SamplingFields):
    """POST /v1/chat/completions body. ``max_completion_tokens`` wins over
    ``max_tokens``; ``logprobs: true`` with ``top_logprobs`` (0..20)
    alternatives returns ``choices[].logprobs.content``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto with tools (needs --tool-call-parser), else none")
    parallel_tool_calls: bool = Field(
        True, description="false: at most one call (enforced for required and named)")
    include_reasoning: bool = Field(
        True, description="return the reasoning split off by --reasoning-parser (vLLM)")
    reasoning_effort: Literal["low", "medium", "high"] | None = Field(
        None, description="passed to the chat template as reasoning_effort (gpt-oss)")


class TokenizeCompletionRequest(_Request):
    """POST /tokenize with a ``prompt`` (vLLM's shape)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_ChatTemplateFields):
    """POST /tokenize with chat ``messages``, rendered by the chat template."""

    model: str | None = None
    messages: list[ChatMessage]
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    """POST /tokenize response: the token ids, their count and the context length."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    """POST /detokenize body."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    """POST /detokenize response."""

    prompt: str


class VersionResponse(BaseModel):
    """GET /version response."""

    version: str


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
