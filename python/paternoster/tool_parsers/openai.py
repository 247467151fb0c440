"""gpt-oss tool calls: harmony ``commentary`` messages to ``functions.NAME``.

Format (OpenAI's harmony format, https://cookbook.openai.com/articles/openai-harmony;
read by :mod:`paternoster.tool_parsers._harmony`; one line in the output,
wrapped here)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

A message with the recipient ``functions.NAME`` (on any channel; the recipient
may also stand before ``<|channel|>``) is a call of ``NAME`` whose body is the
JSON arguments object. The ``<|call|>`` that ends it is a stop token, so a
generation may end right after the arguments: a call cut off there still counts
when its JSON is complete. The content is the text of the ``final`` messages,
of the ``commentary`` messages without a recipient (preambles) and any text
outside messages; ``analysis`` messages and calls of built-in tools (other
recipients, such as ``browser.search``) are the model's reasoning and are not
content (the ``gpt_oss`` reasoning parser reads them). The parser accepts the
raw generation as well as the content the ``gpt_oss`` reasoning parser gives,
which keeps function-call messages in their harmony form for it.

Malformed: a function-call message whose body is not a JSON object (or is cut
short), or that calls a function not among ``tools``, is content, in its harmony
form, from its header through its terminator.
"""

from __future__ import annotations

from paternoster.tool_parsers import _harmony
from paternoster.tool_parsers._json import JsonError, scan_value
from paternoster.tool_parsers.base import PENDING, ToolParser, _Call, skip_ws

FUNCTIONS = "functions."


class OpenAIToolParser(ToolParser):
    """gpt-oss: ``<|channel|>commentary to=functions.NAME ...<|message|>{...}<|call|>``."""

    name = "openai"
    skip_special_tokens = False

    def _scan(self, text: str, final: bool) -> list:
        items: list = []
        for it in _harmony.scan(text, final):
            if isinstance(it, str):
                items.append(it)
            elif not it.header_done:
                items.append(PENDING)
            elif it.recipient is not None and it.recipient.startswith(FUNCTIONS):
                items.append(self._call(it, final))
            elif it.recipient is None and it.channel != "analysis":
                items.append(it.body)
        return items

    def _call(self, msg: _harmony.Message, final: bool) -> _Call | str:
        """The function-call message ``msg`` as a call, pending, or (malformed) content."""
        name = msg.recipient[len(FUNCTIONS) :]
        done = msg.closed or final
        try:
            args, end = scan_value(msg.body, 0)
        except JsonError:
            return msg.raw if done else PENDING
        if not self.known_function(name) or (args and args[0] != "{"):
            return msg.raw if done else PENDING
        if end is None:
            return msg.raw if done else _Call(name, args, False, msg.start)
        if skip_ws(msg.body, end) < len(msg.body):  # text after the arguments
            return msg.raw if done else PENDING
        return _Call(name, args, done, msg.start)
