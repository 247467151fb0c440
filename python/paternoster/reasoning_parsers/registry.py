"""Lookup of reasoning parsers by name.

The built-in parsers are declared under the entry-point group
``paternoster.reasoning_parsers`` in pyproject.toml (``name = "module:Class"``);
a third-party package registers its own parsers in the same group. The built-ins
are also known without the package metadata, so an out-of-date install still
finds them.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points

from paternoster.reasoning_parsers.base import ReasoningParser

ENTRY_POINT_GROUP = "paternoster.reasoning_parsers"

BUILTIN_REASONING_PARSERS: dict[str, str] = {
    "deepseek_r1": "paternoster.reasoning_parsers.think:DeepSeekR1ReasoningParser",
    "gpt_oss": "paternoster.reasoning_parsers.gpt_oss:GptOssReasoningParser",
    "qwen3": "paternoster.reasoning_parsers.think:Qwen3ReasoningParser",
}


def available_reasoning_parsers() -> list[str]:
    """Names of the built-in and installed reasoning parsers, sorted."""
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names | set(BUILTIN_REASONING_PARSERS))


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The :class:`ReasoningParser` subclass registered as ``name``.

    An installed entry point of that name wins over the built-in one.

    Raises:
        ValueError: ``name`` is not a known parser (the message names the
            argument and lists the built-in and installed parsers), or the entry
            point is not a ReasoningParser subclass.
    """
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if matches:
        cls, where = matches[0].load(), matches[0].value
    elif name in BUILTIN_REASONING_PARSERS:
        where = BUILTIN_REASONING_PARSERS[name]
        module, _, attr = where.partition(":")
        cls = getattr(import_module(module), attr)
    else:
        raise ValueError(
            f"reasoning parser name {name!r} is unknown; built-in: "
            f"{', '.join(sorted(BUILTIN_REASONING_PARSERS))}; installed: "
            f"{', '.join(available_reasoning_parsers())}"
        )
    if not (isinstance(cls, type) and issubclass(cls, ReasoningParser)):
        raise ValueError(f"reasoning parser {name!r} ({where}) is not a ReasoningParser subclass")
    return cls
