"""Tool-call parsers: a model's generated text to OpenAI ``tool_calls``.

``get_tool_parser(name)(tools=...)`` gives a parser of one model family's
format; ``extract(text)`` parses a complete generation, ``streaming()`` an
incremental one. See :mod:`paternoster.tool_parsers.base` for the contract
(canonical compact JSON arguments, what counts as content, malformed output).
"""

from paternoster.tool_parsers.base import (
    ExtractedToolCalls,
    StreamDelta,
    StreamingToolParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    make_tool_call_id,
)
from paternoster.tool_parsers.registry import (
    BUILTIN_TOOL_PARSERS,
    ENTRY_POINT_GROUP,
    available_tool_parsers,
    get_tool_parser,
)

__all__ = [
    "BUILTIN_TOOL_PARSERS",
    "ENTRY_POINT_GROUP",
    "ExtractedToolCalls",
    "StreamDelta",
    "StreamingToolParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "available_tool_parsers",
    "get_tool_parser",
    "make_tool_call_id",
]
