"""OpenAI chat messages to the chat template's input.

HF chat templates expect what the OpenAI wire form does not give them as is:
text parts joined into one string, an assistant's tool-call ``arguments`` as a
mapping rather than JSON text (Llama 3.1, Mistral and Qwen templates all read
``tool_call.function.arguments`` as an object; vLLM converts the same way), and
earlier reasoning as ``reasoning_content``.
"""

from __future__ import annotations

import json
from typing import Any

from paternoster.entrypoints.openai.errors import bad_request
from paternoster.entrypoints.openai.protocol import ChatMessage
from paternoster.entrypoints.openai.protocol_tools import ChatTool
from paternoster.frontend.processor import ChatInput


def chat_input(body: Any, messages: list[ChatMessage],
               trust_request_template: bool = False) -> ChatInput:  # fmt: skip
    """Chat messages in the template's form, with the body's template settings
    (``chat_template``, ``add_generation_prompt``, ``continue_final_message``,
    ``add_special_tokens``, ``tools``, ``chat_template_kwargs``, and
    ``reasoning_effort`` as the template variable of that name unless
    ``chat_template_kwargs`` sets it).

    A request's own ``chat_template`` is Jinja code the server would run (a
    few nested loops hold the tokenizer thread for minutes): it is refused
    unless the server trusts its clients (``--trust-request-chat-template``,
    vLLM's flag and default).

    Raises:
        APIError: 400 for a content part that is not text or has no text, an
            empty list of parts, a ``tool`` message without ``tool_call_id``
            (each naming the field's path, e.g. ``messages[2].tool_call_id``,
            as OpenAI does), tool-call arguments that are not a JSON object,
            two tools of the same name, or a ``chat_template`` the server does
            not trust.
    """
    if body.chat_template is not None and not trust_request_template:
        raise bad_request("chat_template in a request is refused: the server runs it as code; "
                          "start the server with --trust-request-chat-template to allow it, or "
                          "with --chat-template FILE", "chat_template")  # fmt: skip
    converted = [_message(i, m) for i, m in enumerate(messages)]
    kwargs = body.chat_template_kwargs
    effort = getattr(body, "reasoning_effort", None)
    if effort is not None and "reasoning_effort" not in (kwargs or {}):
        kwargs = {**(kwargs or {}), "reasoning_effort": effort}
    return ChatInput(
        converted, body.chat_template, body.add_generation_prompt,
        body.continue_final_message, body.add_special_tokens,
        tools=tools_for_template(body.tools), template_kwargs=kwargs,
    )  # fmt: skip


def tools_for_template(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """``tools`` as plain OpenAI dicts (unset fields left out).

    Raises:
        APIError: 400 naming ``tools`` for two functions of the same name, an
            empty name, or ``parameters`` that do not describe an object.
    """
    if tools is None:
        return None
    for i, t in enumerate(tools):
        where = f"tools[{i}].function"
        if not t.function.name:
            raise bad_request(f"{where}.name must not be empty", "tools")
        kind = (t.function.parameters or {}).get("type", "object")
        if kind != "object":
            raise bad_request(f"{where}.parameters must describe an object (the arguments), "
                              f"got type {kind!r}", "tools")  # fmt: skip
    names = [t.function.name for t in tools]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise bad_request(f"tools has two functions named {dup!r}", "tools")
    return [t.model_dump(exclude_none=True) for t in tools]


def _message(i: int, m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool" and m.tool_call_id is None:
        where = f"messages[{i}].tool_call_id"
        raise bad_request(f"{where} is missing: a 'tool' message must name the tool call "
                          "it answers", where)  # fmt: skip
    out: dict[str, Any] = {"role": m.role, "content": _content(i, m.content)}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if m.tool_calls:
        out["tool_calls"] = [_tool_call(i, j, c.id, c.function.name, c.function.arguments)
                             for j, c in enumerate(m.tool_calls)]  # fmt: skip
    return out


def _content(i: int, content: Any) -> str | None:
    """Text parts joined (400 for any other part, a part without text, no
    parts), each error naming the field's path as OpenAI does
    (``messages[1].content``, ``messages[1].content[0].text``)."""
    if not isinstance(content, list):
        return content
    where = f"messages[{i}].content"
    if not content:
        raise bad_request(f"{where} must not be an empty list: send at least one part, "
                          "or a string", where)  # fmt: skip
    for j, p in enumerate(content):
        if p.type != "text":
            raise bad_request(f"{where}[{j}].type must be 'text' (only text content parts "
                              f"are supported), got {p.type!r}", f"{where}[{j}].type")  # fmt: skip
        if p.text is None:
            raise bad_request(f"{where}[{j}].text is missing: a text part must carry text",
                              f"{where}[{j}].text")  # fmt: skip
    return "".join(p.text for p in content)


def _tool_call(i: int, j: int, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    where = f"messages[{i}].tool_calls[{j}].function.arguments"
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise bad_request(f"{where} is not valid JSON: {arguments[:80]!r}",
                          "messages") from None  # fmt: skip
    if not isinstance(args, dict):
        raise bad_request(f"{where} must be a JSON object", "messages")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
