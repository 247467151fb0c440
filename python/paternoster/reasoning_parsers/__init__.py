"""Reasoning parsers: a reasoning model's generated text to ``reasoning`` and ``content``.

``get_reasoning_parser(name)(tokenizer)`` gives a parser of one model family's
format; ``extract(text, in_reasoning=...)`` splits a complete generation,
``streaming(in_reasoning=...)`` an incremental one, and ``starts_in_reasoning``
tells from the rendered prompt whether the output begins inside the reasoning.
See :mod:`paternoster.reasoning_parsers.base` for the contract (text kept as
written, held-back tags, streamed fragments equal to ``extract``'s fields).
"""

from paternoster.reasoning_parsers.base import (
    ExtractedReasoning,
    ReasoningDelta,
    ReasoningParser,
    Split,
    StreamingReasoningParser,
)
from paternoster.reasoning_parsers.registry import (
    BUILTIN_REASONING_PARSERS,
    ENTRY_POINT_GROUP,
    available_reasoning_parsers,
    get_reasoning_parser,
)

__all__ = [
    "BUILTIN_REASONING_PARSERS",
    "ENTRY_POINT_GROUP",
    "ExtractedReasoning",
    "ReasoningDelta",
    "ReasoningParser",
    "Split",
    "StreamingReasoningParser",
    "available_reasoning_parsers",
    "get_reasoning_parser",
]
