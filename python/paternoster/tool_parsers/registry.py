"""Lookup of tool parsers by name.

The built-in parsers are declared under the entry-point group
``paternoster.tool_parsers`` in pyproject.toml (``name = "module:Class"``); a
third-party package registers its own parsers in the same group. The built-ins
are also known without the package metadata, so an out-of-date install still
finds them.
"""

from __future__ import annotations

from paternoster.plugins import available_plugins, load_plugin
from paternoster.tool_parsers.base import ToolParser

ENTRY_POINT_GROUP = "paternoster.tool_parsers"

BUILTIN_TOOL_PARSERS: dict[str, str] = {
    "hermes": "paternoster.tool_parsers.hermes:HermesToolParser",
    "llama3_json": "paternoster.tool_parsers.llama3_json:Llama3JsonToolParser",
    "mistral": "paternoster.tool_parsers.mistral:MistralToolParser",
    "openai": "paternoster.tool_parsers.openai:OpenAIToolParser",
    "pythonic": "paternoster.tool_parsers.pythonic:PythonicToolParser",
    "qwen3_coder": "paternoster.tool_parsers.qwen3_coder:Qwen3CoderToolParser",
}


def available_tool_parsers() -> list[str]:
    """Names of the built-in and installed tool parsers, sorted."""
    return available_plugins(ENTRY_POINT_GROUP, BUILTIN_TOOL_PARSERS)


def get_tool_parser(name: str) -> type[ToolParser]:
    """The :class:`ToolParser` subclass registered as ``name``.

    An installed entry point of that name wins over the built-in one.

    Raises:
        ValueError: ``name`` is not a known parser (the message names the
            argument and lists the built-in and installed parsers), or the entry
            point is not a ToolParser subclass.
    """
    return load_plugin(ENTRY_POINT_GROUP, BUILTIN_TOOL_PARSERS, name, ToolParser, "tool parser")
