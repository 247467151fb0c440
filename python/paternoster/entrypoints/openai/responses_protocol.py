"""The request model and response shapes of POST /v1/responses, OpenAI's Responses API
(stateless subset; docs/compatibility.md lists what is left out).

Same conventions as :mod:`protocol`: unknown fields are ignored, types are
strict. The wire shapes follow the ``openai`` SDK's typed models
(``openai.types.responses``: ``ResponseCreateParams``, ``ResponseInputItemParam``,
``FunctionToolParam``, ``ResponseTextConfigParam``). Anything the server
cannot honour (built-in tools, ``previous_response_id``, images) is a 400
naming the top-level field, never silently dropped. Responses and their
output items are plain dicts shaped like the SDK's ``Response`` (built by the
functions at the end), shared by the JSON and the streamed answers.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from paternoster.entrypoints.openai.protocol_base import _Request, _SchedulingFields


class InputTextPart(_Request):
    """A text content part of an input message: ``input_text`` (user, system,
    developer) or ``output_text`` (an earlier assistant output passed back)."""

    type: Literal["input_text", "output_text"]
    text: str


def _kind(value: Any, default: str | None = None) -> str | None:
    """The ``type`` of an item or part, parsed or not (``default`` when absent)."""
    if isinstance(value, dict):
        return value.get("type", default)
    return getattr(value, "type", default)


_TextPart = Annotated[
    Annotated[InputTextPart, Tag("input_text")] | Annotated[InputTextPart, Tag("output_text")],
    Discriminator(
        _kind,
        custom_error_type="content_part",
        custom_error_message="only input_text and output_text content parts are supported",
    ),
]
Content = str | list[_TextPart]
"""Message content: a string, or text parts (joined when mapped to chat)."""


class InputMessage(_Request):
    """A message input item (``EasyInputMessage`` / ``ResponseInputItem.Message``
    / an earlier ``ResponseOutputMessage``); ``type`` may be left out."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Content


class FunctionCallItem(_Request):
    """A ``function_call`` input item: a call the model made earlier
    (``ResponseFunctionToolCall``). ``call_id`` links it to its output."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class FunctionCallOutputItem(_Request):
    """A ``function_call_output`` input item: the result of the call ``call_id``
    (a string, or text parts that are joined)."""

    type: Literal["function_call_output"]
    call_id: str
    output: Content


class ReasoningText(_Request):
    """A ``summary_text`` or ``reasoning_text`` part of a reasoning item."""

    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Request):
    """A ``reasoning`` input item (``ResponseReasoningItem``) passed back from an
    earlier response. Its ``content`` text (else its ``summary`` text) becomes
    the ``reasoning_content`` of the assistant message that follows it;
    ``encrypted_content`` is ignored (nothing is encrypted here)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None

    @property
    def text(self) -> str:
        """The reasoning text: the ``content`` parts joined, else the ``summary`` parts."""
        parts = self.content if self.content else self.summary
        return "".join(p.text for p in parts)


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        lambda item: _kind(item, "message"),
        custom_error_type="input_item",
        custom_error_message="only message, function_call, function_call_output and reasoning "
        "input items are supported (item_reference needs stored responses)",
    ),
]


class ResponsesFunctionTool(_Request):
    """A function tool in the Responses API's flat shape (``FunctionToolParam``):
    ``{"type": "function", "name", "description", "parameters", "strict"}``."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesToolChoice(_Request):
    """``tool_choice: {"type": "function", "name": ...}``: call that function."""

    type: Literal["function"]
    name: str


class ResponsesTextFormat(_Request):
    """``text.format`` (``ResponseFormatTextConfigParam``): ``text`` (no
    constraint), ``json_object``, or ``json_schema`` with ``name`` and ``schema``."""

    model_config = _Request.model_config | {"populate_by_name": True}

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponsesTextFormat:
        """A ``json_schema`` format needs its ``schema``."""
        if self.type == "json_schema" and self.json_schema is None:
            raise PydanticCustomError("json_schema", "format json_schema needs a schema")
        return self


class ResponsesTextConfig(_Request):
    """``text``: the output's ``format`` (``verbosity`` is ignored)."""

    format: ResponsesTextFormat | None = None


class ResponsesReasoningConfig(_Request):
    """``reasoning``: ``effort`` reaches the chat template as
    ``chat_template_kwargs["reasoning_effort"]``; ``summary`` is accepted and
    ignored (the reasoning text itself is returned)."""

    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_SchedulingFields):
    """POST /v1/responses body (OpenAI's ``ResponseCreateParams``, stateless).

    ``input`` is a string (one user message) or a list of input items;
    ``instructions`` becomes a leading system message. ``store`` is accepted
    but nothing is stored, so ``previous_response_id`` and ``conversation``
    are a 400. ``chat_template_kwargs`` (a vLLM extension) goes to the chat
    template as is. ``priority``, ``slo_ttft_s`` and ``slo_itl_s`` are this
    server's scheduling fields, as on chat completions; ``user`` (or the
    ``X-Tenant-Id`` header, which wins) is the tenant.
    """

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = False
    text: ResponsesTextConfig | None = None
    reasoning: ResponsesReasoningConfig | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _only_function_tools(cls, value: Any) -> Any:
        """Built-in tools (web_search, file_search, ...) cannot run here."""
        if isinstance(value, list):
            for i, tool in enumerate(value):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind != "function":
                    raise PydanticCustomError(
                        "tool_type",
                        "tools[{i}] has type {kind}: only function tools are supported",
                        {"i": i, "kind": kind},
                    )
        return value

    @field_validator("previous_response_id", "conversation")
    @classmethod
    def _stateless(cls, value: Any) -> Any:
        """Nothing is stored, so there is no earlier response to continue."""
        if value is not None:
            raise PydanticCustomError(
                "stateless",
                "this server is stateless: responses are not stored; pass the earlier "
                "output items in `input` instead",
            )
        return value

    @field_validator("background")
    @classmethod
    def _not_background(cls, value: bool | None) -> bool | None:
        """Background responses need stored responses to poll."""
        if value:
            raise PydanticCustomError("stateless", "background responses are not supported")
        return value


# ------------------------------------------------------------- responses
# Plain dicts shaped like the SDK's ``Response`` and its output items.


def new_id(prefix: str) -> str:
    """A fresh id such as ``resp_<32 hex>``, ``msg_...``, ``fc_...``, ``rs_...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str) -> dict:
    """A ``reasoning`` output item (``ResponseReasoningItem``) with the text as one
    ``reasoning_text`` part and no summary."""
    return {"id": item_id, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}  # fmt: skip


def output_text_part(text: str) -> dict:
    """An ``output_text`` content part (``ResponseOutputText``), no annotations."""
    return {"type": "output_text", "text": text, "annotations": []}


def message_item(item_id: str, text: str, status: str) -> dict:
    """An assistant ``message`` output item (``ResponseOutputMessage``)."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text_part(text)]}  # fmt: skip


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str) -> dict:  # fmt: skip
    """A ``function_call`` output item (``ResponseFunctionToolCall``)."""
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def usage(chat_usage: dict | None) -> dict | None:
    """``ResponseUsage`` of a chat ``usage`` (reasoning and cached tokens are
    not counted separately: reported as 0)."""
    if chat_usage is None:
        return None
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def response_object(body: ResponsesRequest, response_id: str, created_at: int, model: str, *,
                    status: str, output: list[dict], usage: dict | None) -> dict:  # fmt: skip
    """A ``Response`` object: the output and the request's settings echoed
    (the SDK requires ``tools``, ``tool_choice`` and ``parallel_tool_calls``).
    ``status`` ``incomplete`` carries ``incomplete_details.reason``
    ``max_output_tokens``, the only way a generation here stops short."""
    text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text else {}
    text.setdefault("format", {"type": "text"})
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice.model_dump()
        if body.tool_choice is not None and not isinstance(body.tool_choice, str)
        else body.tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": None,
        "reasoning": body.reasoning.model_dump() if body.reasoning else None,
        "store": bool(body.store),
        "text": text,
        "truncation": body.truncation or "disabled",
        "metadata": body.metadata or {},
        "user": body.user,
        "usage": usage,
    }


def final_status(finish_reason: str | None) -> str:
    """``incomplete`` when the chat choice stopped at its token limit, else ``completed``."""
    return "incomplete" if finish_reason == "length" else "completed"
