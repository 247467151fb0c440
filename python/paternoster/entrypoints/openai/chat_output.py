"""A chat choice's generated text shaped into the assistant message.

The text goes through two optional stages, in this order:

1. the server's ``--reasoning-parser`` splits off the reasoning (``<think>``
   blocks, gpt-oss's analysis channel) into ``reasoning_content`` and
   ``reasoning`` (vLLM's older and newer names, both sent);
2. the request's :class:`~paternoster.entrypoints.openai.tool_calls.ToolPlan`
   reads tool calls out of what remains, the answer: calls are never looked for
   inside the reasoning.

:class:`ChoiceOutput` does this for one choice, whole (:meth:`ChoiceOutput.message`)
or streamed (:meth:`ChoiceOutput.feed`); both are built on the parsers' shared
contracts, so a stream's deltas concatenate to the non-streamed message.
"""

from __future__ import annotations

from dataclasses import dataclass

from paternoster.entrypoints.openai.protocol_outputs import AssistantMessage, DeltaMessage
from paternoster.entrypoints.openai.tool_calls import ChoiceToolCalls, ToolPlan
from paternoster.reasoning_parsers import ReasoningParser


@dataclass(frozen=True)
class ReasoningPlan:
    """A chat request's reasoning handling.

    Attributes:
        parser: the server's reasoning parser.
        in_reasoning: whether the rendered prompt left the model inside an open
            reasoning block (:meth:`ReasoningParser.starts_in_reasoning`).
        include: return the reasoning (``include_reasoning``); ``False`` drops it.
    """

    parser: ReasoningParser
    in_reasoning: bool
    include: bool = True


class ChoiceOutput:
    """One choice's text into ``reasoning``, ``content`` and ``tool_calls``.

    Args:
        tools: the request's tool plan, or ``None`` (no tool parsing).
        reasoning: the request's reasoning plan, or ``None`` (no reasoning split).
    """

    def __init__(self, tools: ToolPlan | None, reasoning: ReasoningPlan | None):
        self.tools = tools
        self.reasoning = reasoning
        self._tool_stream = ChoiceToolCalls(tools) if tools is not None else None
        self._reasoning_stream = (
            reasoning.parser.streaming(in_reasoning=reasoning.in_reasoning)
            if reasoning is not None else None
        )  # fmt: skip

    def message(self, text: str, finish_reason: str | None) -> tuple[AssistantMessage, str | None]:
        """A finished choice's message and finish reason (``"tool_calls"`` after calls)."""
        thought, content = None, text
        if self.reasoning is not None:
            found = self.reasoning.parser.extract(text, in_reasoning=self.reasoning.in_reasoning)
            thought, content = found.reasoning, found.content
        calls = []
        if self.tools is not None:
            content, calls = self.tools.message(content or "")
            finish_reason = self.tools.finish_reason(finish_reason, bool(calls))
        if thought is not None and not self.reasoning.include:
            thought = None
        message = AssistantMessage(
            content=content, tool_calls=calls, reasoning_content=thought, reasoning=thought
        )
        return message, finish_reason

    def feed(self, text: str, finish_reason: str | None) -> tuple[DeltaMessage, str | None]:
        """The delta to stream for ``text`` (everything held back is flushed
        when ``finish_reason`` is set), and the finish reason to send."""
        final = finish_reason is not None
        thought, content = None, text
        if self._reasoning_stream is not None:
            part = self._reasoning_stream.feed(text)
            if final:
                tail = self._reasoning_stream.finish()
                part = type(part)((part.reasoning or "") + (tail.reasoning or ""),
                                  (part.content or "") + (tail.content or ""))  # fmt: skip
            thought, content = part.reasoning or None, part.content or ""
            if not self.reasoning.include:
                thought = None
        calls = None
        if self._tool_stream is not None:
            parsed = self._tool_stream.feed(content, final)
            content = parsed.content or ""
            calls = [c.to_openai() for c in parsed.tool_calls] or None
            finish_reason = self.tools.finish_reason(finish_reason, self._tool_stream.called)
        delta = DeltaMessage(content=content or None, tool_calls=calls,
                             reasoning_content=thought, reasoning=thought)  # fmt: skip
        return delta, finish_reason
