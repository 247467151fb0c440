"""Tool calling on /v1/chat/completions: how ``tools`` and ``tool_choice``
shape a request's generation and its output (OpenAI's semantics, vLLM's
mechanism).

- ``none`` (the default without ``tools``): the template still sees the tools
  (as in vLLM), the output is plain content.
- ``auto`` (the default with ``tools``): the model decides; the server's
  ``--tool-call-parser`` reads its family's call format out of the text. A
  server started without one answers 400 rather than return calls as text.
- ``required`` and a named function: structured outputs force the output
  into JSON that is a call (see :mod:`paternoster.tool_parsers.forced`), so it
  always parses; ``parallel_tool_calls: false`` allows only one call.

A choice that made calls and stopped gets ``finish_reason: "tool_calls"``
(``"stop"`` for a named function, as OpenAI answers); one cut by
``max_tokens`` keeps ``"length"`` and its unfinished call stays content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from paternoster.entrypoints.openai.constraints import SOURCE_PARAM
from paternoster.entrypoints.openai.errors import bad_request
from paternoster.entrypoints.openai.protocol import ChatCompletionRequest
from paternoster.entrypoints.openai.protocol_tools import ToolCallOut
from paternoster.structured_outputs import normalize_spec
from paternoster.tool_parsers import StreamDelta, StreamingToolParser, ToolParser
from paternoster.tool_parsers.forced import (
    NamedToolParser,
    RequiredToolParser,
    required_calls_schema,
)

#: The arguments of a function without ``parameters`` (or with ``{}``): OpenAI
#: reads an omitted ``parameters`` as an empty parameter list.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {},
                                 "additionalProperties": False}  # fmt: skip


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tool calling, decided before it is submitted.

    Attributes:
        parser: reads the calls out of each choice's text.
        constraint: the structured-output spec forcing the calls (``required``
            and named choices), or ``None``.
        calls_finish_reason: the finish reason of a choice that stopped after
            making calls.
        skip_special_tokens: ``False`` when the format's tags are special
            tokens that detokenization would otherwise drop.
        parallel: ``parallel_tool_calls``; ``False`` keeps only the first call
            (enforced by the grammar for forced choices, by dropping the others
            for ``auto``, as vLLM does).
    """

    parser: ToolParser
    constraint: dict[str, Any] | None
    calls_finish_reason: str
    skip_special_tokens: bool = True
    parallel: bool = True

    def streaming(self) -> StreamingToolParser:
        """A fresh incremental parser for one choice."""
        return self.parser.streaming()

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """The choice's finish reason: a stop after calls becomes :attr:`calls_finish_reason`."""
        return self.calls_finish_reason if reason == "stop" and called else reason

    def message(self, text: str) -> tuple[str | None, list[ToolCallOut]]:
        """A finished choice's ``content`` and ``tool_calls``."""
        found = self.parser.extract(text)
        calls = found.calls if self.parallel else found.calls[:1]
        return found.content, [ToolCallOut.model_validate(c.to_openai()) for c in calls]


def plan_tools(body: ChatCompletionRequest, parser_cls: type[ToolParser] | None,
               has_constraint: bool) -> ToolPlan | None:  # fmt: skip
    """Decide a chat request's tool calling.

    Args:
        body: the request.
        parser_cls: the server's ``--tool-call-parser``, or ``None``.
        has_constraint: the request already carries a structured-output
            constraint (``response_format``, ``structured_outputs``, ``guided_*``).
    Returns:
        The plan, or ``None`` when the output is plain content.
    Raises:
        APIError: 400 naming ``tool_choice``: a choice other than ``none``
            without ``tools``, a named function not among them, ``auto``
            without a server parser, or a forced choice combined with another
            constraint.
    """
    choice = body.tool_choice
    tools = body.tools or []
    if not tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if choice == "none":
        return None
    schemas = {t.function.name: t.function.parameters or NO_PARAMETERS for t in tools}
    kwargs = {"tools": [t.model_dump(exclude_none=True) for t in tools]}
    if choice is None or choice == "auto":
        if parser_cls is None:
            raise bad_request(
                'tool_choice "auto" (the default with tools) needs the server started with '
                '--tool-call-parser NAME; or use tool_choice "required", a named function, '
                'or "none"', "tool_choice")  # fmt: skip
        parser = parser_cls(**kwargs)
        return ToolPlan(parser, None, "tool_calls", parser_cls.skip_special_tokens,
                        body.parallel_tool_calls)  # fmt: skip
    if has_constraint:
        raise bad_request("a required or named tool_choice cannot be combined with "
                          "response_format or structured_outputs", "tool_choice")  # fmt: skip
    if choice == "required":
        schema = required_calls_schema(schemas, body.parallel_tool_calls)
        return ToolPlan(RequiredToolParser(**kwargs), _constraint(schema), "tool_calls")
    name = choice.function.name
    if name not in schemas:
        raise bad_request(f"tool_choice names function {name!r}, which is not among tools",
                          "tool_choice")  # fmt: skip
    schema = schemas[name]
    return ToolPlan(NamedToolParser(name, **kwargs), _constraint(schema), "stop")


def _constraint(schema: dict[str, Any]) -> dict[str, Any]:
    """The structured-output spec of a JSON schema built from ``tools`` (its
    errors name ``tools``).

    Raises:
        APIError: 400 naming ``tools`` for a schema that is not JSON.
    """
    try:
        spec = normalize_spec({"json": json.dumps(schema)})
    except (ValueError, TypeError) as e:
        raise bad_request(f"tools: {e}", "tools") from None
    return {**spec, SOURCE_PARAM: "tools"}


class ChoiceToolCalls:
    """One streamed choice's tool calls: text deltas in, content and call items out.

    Args:
        plan: the request's :class:`ToolPlan`.
    """

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self._parser = plan.streaming()
        self.called = False

    def feed(self, text: str, final: bool) -> StreamDelta:
        """What to send for ``text`` (and, when ``final``, everything held back).

        Arguments stream as they are generated, so a call whose name was sent
        and which the generation then leaves unfinished (``max_tokens``, a stop
        string) or malformed cannot be taken back: its text then also arrives
        as content, as in the non-streamed message, and :attr:`called` (the
        ``tool_calls`` finish reason) counts only the calls that completed.
        """
        out = self._parser.feed(text)
        if final:
            tail = self._parser.finish()
            out = StreamDelta((out.content or "") + (tail.content or "") or None,
                              [*out.tool_calls, *tail.tool_calls])  # fmt: skip
            self.called = bool(self.plan.parser.scan_calls(self._parser.text))
        if not self.plan.parallel:
            out = StreamDelta(out.content, [c for c in out.tool_calls if c.index == 0])
        return out
