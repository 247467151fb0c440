"""POST /v1/responses as a mapping onto chat completions.

A Responses request becomes a chat completions body (:func:`to_chat_request`),
the chat path generates, and its answer is mapped back: a chat completion to a
``Response`` (:func:`to_response`), a chat stream to Responses events
(:class:`~paternoster.entrypoints.openai.responses_stream.ResponsesStreamTranslator`).
Nothing is stored: every request carries its whole conversation in ``input``.

Shapes follow the ``openai`` SDK's typed models (``openai.types.responses``);
the chat side is OpenAI's chat completions wire shape plus vLLM's
``reasoning_content`` / ``reasoning`` fields and ``chat_template_kwargs``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from paternoster.entrypoints.openai.errors import APIError, bad_request, renamed_in_message
from paternoster.entrypoints.openai.protocol import ChatCompletionRequest
from paternoster.entrypoints.openai.responses_protocol import (
    Content,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    ReasoningItem,
    ResponsesRequest,
    final_status,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    response_object,
    usage,
)
from paternoster.entrypoints.openai.responses_stream import responses_events
from paternoster.entrypoints.openai.sse import EventStream

# Chat completions fields that are named differently in a Responses request,
# so that a 400 from the chat path names the field the client sent.
_PARAM_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text",
    "structured_outputs": "text",
}


def responses_param(chat_param: str | None) -> str | None:
    """The Responses request field that a chat completions field came from (a
    path inside one chat message, ``messages[2].content``, is ``input``: chat
    messages and input items are not numbered alike)."""
    if chat_param and chat_param.startswith("messages["):
        return "input"
    return _PARAM_NAMES.get(chat_param, chat_param) if chat_param else chat_param


def check_input(body: ResponsesRequest) -> None:
    """Refuse an input item whose content is an empty list of parts (a
    ``message``'s ``content``, a ``function_call_output``'s ``output``), as
    chat completions refuses ``content: []``.

    Raises:
        APIError: 400 naming the item's field, e.g. ``input[1].content``.
    """
    if isinstance(body.input, str):
        return
    for i, item in enumerate(body.input):
        if isinstance(item, InputMessage):
            field, value = "content", item.content
        elif isinstance(item, FunctionCallOutputItem):
            field, value = "output", item.output
        else:
            continue
        if isinstance(value, list) and not value:
            where = f"input[{i}].{field}"
            raise bad_request(f"{where} must not be an empty list: send at least one part, "
                              "or a string", where)  # fmt: skip


# ---------------------------------------------------------------- requests


def _text(content: Content) -> str:
    """A string content, or its text parts joined."""
    return content if isinstance(content, str) else "".join(p.text for p in content)


def to_chat_messages(body: ResponsesRequest) -> list[dict]:
    """The chat ``messages`` of a Responses request.

    ``instructions`` come first as a system message; a string ``input`` is
    one user message. Input items map as follows (an assistant turn in the
    Responses API is several items, in chat one message):

    - ``message``: a message of the same role, text parts joined;
    - ``function_call``: a ``tool_calls`` entry (``id`` = ``call_id``) of the
      assistant message just before it, or of a new assistant message with
      ``content: None``;
    - ``function_call_output``: a ``tool`` message with ``tool_call_id`` = ``call_id``;
    - ``reasoning``: its text becomes the ``reasoning_content`` of the next
      assistant message (dropped when a non-assistant message comes first),
      and it starts a new assistant message.
    """
    messages: list[dict] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    reasoning: str | None = None  # waiting for the assistant message it belongs to
    can_extend = False  # the last message is an assistant turn that a call may join
    for item in body.input:
        if isinstance(item, ReasoningItem):
            reasoning, can_extend = item.text, False
        elif isinstance(item, InputMessage):
            message = {"role": item.role, "content": _text(item.content)}
            if item.role == "assistant" and reasoning is not None:
                message["reasoning_content"] = reasoning
            if item.role != "assistant" or "reasoning_content" in message:
                reasoning = None
            messages.append(message)
            can_extend = item.role == "assistant"
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            if can_extend:
                messages[-1].setdefault("tool_calls", []).append(call)
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
            can_extend = True
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
            )
            reasoning, can_extend = None, False
    return messages


def to_chat_request(body: ResponsesRequest) -> dict:
    """The chat completions body (a dict) of a Responses request.

    ``max_output_tokens`` -> ``max_completion_tokens``; flat function tools
    -> ``{"type": "function", "function": {...}}``; ``tool_choice``
    ``{"type": "function", "name"}`` -> ``{"type": "function", "function":
    {"name"}}``; ``text.format`` -> ``response_format``; ``reasoning.effort``
    -> ``chat_template_kwargs["reasoning_effort"]`` (the client's own
    ``chat_template_kwargs`` win); a stream asks for the usage chunk.
    Sampling fields (``temperature``, ``top_p``, ``seed``), ``user`` and the
    scheduling fields (``priority``, ``slo_ttft_s``, ``slo_itl_s``) are
    copied; fields left unset are left out.
    """
    chat: dict[str, Any] = {"messages": to_chat_messages(body), "stream": body.stream}
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    copied = {"model": body.model, "max_completion_tokens": body.max_output_tokens,
              "temperature": body.temperature, "top_p": body.top_p, "seed": body.seed,
              "user": body.user, "parallel_tool_calls": body.parallel_tool_calls,
              "priority": body.priority or None, "slo_ttft_s": body.slo_ttft_s,
              "slo_itl_s": body.slo_itl_s}  # fmt: skip
    chat.update({k: v for k, v in copied.items() if v is not None})
    if body.tools is not None:
        chat["tools"] = [
            {
                "type": "function",
                "function": t.model_dump(exclude={"type"}, exclude_none=True),
            }  # fmt: skip
            for t in body.tools
        ]
    if isinstance(body.tool_choice, str):
        chat["tool_choice"] = body.tool_choice
    elif body.tool_choice is not None:
        chat["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        spec = {"name": fmt.name, "description": fmt.description, "schema": fmt.json_schema,
                "strict": fmt.strict}  # fmt: skip
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in spec.items() if v is not None},
        }
    kwargs = {}
    if body.reasoning is not None and body.reasoning.effort is not None:
        kwargs["reasoning_effort"] = body.reasoning.effort
    kwargs.update(body.chat_template_kwargs or {})
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    return chat


# --------------------------------------------------------------- responses


def to_response(body: ResponsesRequest, chat: dict) -> dict:
    """The ``Response`` of a chat completion (choice 0; Responses has no ``n``).

    Output items, in order: a ``reasoning`` item when the message has
    ``reasoning_content`` (or vLLM's newer ``reasoning``), a ``message`` item
    when it has content or no tool calls, then one ``function_call`` item per
    tool call (``call_id`` = the tool call's ``id``). When the choice stopped
    at its token limit the response and its last item are ``incomplete``.
    """
    choice = chat["choices"][0]
    message = choice["message"]
    status = final_status(choice.get("finish_reason"))
    output = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning, "completed"))
    tool_calls = message.get("tool_calls") or []
    if message.get("content") or not tool_calls:
        output.append(message_item(new_id("msg"), message.get("content") or "", "completed"))
    for call in tool_calls:
        fn = call["function"]
        output.append(function_call_item(new_id("fc"), call["id"], fn["name"],
                                         fn["arguments"], "completed"))  # fmt: skip
    if output and status == "incomplete":
        output[-1]["status"] = "incomplete"
    created_at = int(chat.get("created") or time.time())
    return response_object(body, new_id("resp"), created_at, chat["model"], status=status,
                           output=output, usage=usage(chat.get("usage")))  # fmt: skip


# ---------------------------------------------------------------- endpoint


def _chat_body(body: ResponsesRequest) -> ChatCompletionRequest:
    """The validated chat request of ``body``.

    Raises:
        APIError: 400 naming the Responses field when the chat model refuses
            it, or an input item with an empty list of parts (:func:`check_input`).
    """
    check_input(body)
    try:
        return ChatCompletionRequest.model_validate(to_chat_request(body))
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        param = responses_param(loc[0]) if loc else None
        raise bad_request(f"{param}: {first.get('msg', 'invalid value')}", param) from None


async def create_response(serving: Any, body: ResponsesRequest, raw: Request):
    """Handle POST /v1/responses through ``serving.create_chat_completion``
    (an :class:`~paternoster.entrypoints.openai.serving.OpenAIServing`; its
    ``model_name`` is the streamed response's ``model``).

    Returns:
        A JSON ``Response``, or with ``stream`` an :class:`EventStream` of
        Responses events (the chat stream's release and disconnect handling kept).
    Raises:
        APIError: what the chat path raises (400 bad input, 404 unknown model,
            503 engine down), its ``param`` renamed to the Responses field.
        EngineOverloadedError: the waiting queue is full.
    """
    chat_body = _chat_body(body)
    try:
        result = await serving.create_chat_completion(chat_body, raw)
    except APIError as e:
        old, e.param = e.param, responses_param(e.param)
        e.message = renamed_in_message(e.message, old, e.param)
        raise
    if isinstance(result, EventStream):
        return result.mapped(lambda events: responses_events(body, events, serving.model_name))
    return JSONResponse(to_response(body, result.model_dump()))
