"""Lookup of reasoning parsers by name.

The built-in parsers are declared under the entry-point group
``paternoster.reasoning_parsers`` in pyproject.toml (``name = "module:Class"``);
a third-party package registers its own parsers in the same group. The built-ins
are also known without the package metadata, so an out-of-date install still
finds them.
"""

from __future__ import annotations

from paternoster.plugins import available_plugins, load_plugin
from paternoster.reasoning_parsers.base import ReasoningParser

ENTRY_POINT_GROUP = "paternoster.reasoning_parsers"

BUILTIN_REASONING_PARSERS: dict[str, str] = {
    "deepseek_r1": "paternoster.reasoning_parsers.think:DeepSeekR1ReasoningParser",
    "gpt_oss": "paternoster.reasoning_parsers.gpt_oss:GptOssReasoningParser",
    "qwen3": "paternoster.reasoning_parsers.think:Qwen3ReasoningParser",
}


def available_reasoning_parsers() -> list[str]:
    """Names of the built-in and installed reasoning parsers, sorted."""
    return available_plugins(ENTRY_POINT_GROUP, BUILTIN_REASONING_PARSERS)


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The :class:`ReasoningParser` subclass registered as ``name``.

    An installed entry point of that name wins over the built-in one.

    Raises:
        ValueError: ``name`` is not a known parser (the message names the
            argument and lists the built-in and installed parsers), or the entry
            point is not a ReasoningParser subclass.
    """
    return load_plugin(ENTRY_POINT_GROUP, BUILTIN_REASONING_PARSERS, name, ReasoningParser,
                       "reasoning parser")  # fmt: skip
