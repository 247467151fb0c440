"""Pydantic models of tool (function) calling in the OpenAI-compatible chat API:
the ``tools`` a request offers, its ``tool_choice``, the ``tool_calls`` of an
assistant message in the request, and the tool calls the model generated."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from paternoster.entrypoints.openai.protocol_base import _Request


class FunctionCall(_Request):
    """The ``function`` of a tool call: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCallItem(_Request):
    """An item of an assistant message's ``tool_calls`` (OpenAI's shape)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Request):
    """A function the model may call: ``parameters`` is its arguments' JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Request):
    """An item of ``tools`` (only ``function`` tools exist)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Request):
    """The ``function`` of a named ``tool_choice``."""

    name: str


class NamedToolChoice(_Request):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCallOut(BaseModel):
    """The ``function`` of a generated tool call (``arguments``: compact JSON text)."""

    name: str
    arguments: str


class ToolCallOut(BaseModel):
    """A generated tool call."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut
