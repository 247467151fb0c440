"""gpt-oss reasoning: the ``analysis`` channel of OpenAI's harmony format.

Format (https://cookbook.openai.com/articles/openai-harmony; read by
:mod:`paternoster.tool_parsers._harmony`), the output after the prompt's
``<|start|>assistant`` (one line in the output, wrapped here)::

    <|channel|>analysis<|message|>The user wants a greeting.<|end|>
    <|start|>assistant<|channel|>final<|message|>Hello!<|return|>

The reasoning is the text of the ``analysis`` messages, and of calls of built-in
tools (recipients other than ``functions.*``), concatenated as written. The
content is the text of the ``final`` messages and of ``commentary`` messages
without a recipient (preambles shown to the user), concatenated as written. A
function call (``to=functions.NAME``) stays in the content in its harmony form,
from its header through ``<|call|>``, for the ``openai`` tool parser to read; use
that tool parser whenever the request has tools. The tags are special tokens,
so the output must be detokenized with them (``skip_special_tokens`` False).

``in_reasoning`` True means the prompt ended inside an analysis message (after
``<|channel|>analysis<|message|>``); ``None`` means False, the output starting
with its first header as after the usual ``<|start|>assistant``. The answer
part begins (``reasoning_ended``) with the first message that is not reasoning;
the end marker (:meth:`reasoning_end_text`) is ``<|channel|>final<|message|>``.

Why not the ``openai-harmony`` package: see :mod:`paternoster.tool_parsers._harmony`
(it cannot load its encoding without internet access).
"""

from __future__ import annotations

from typing import Any

from paternoster.reasoning_parsers.base import ReasoningParser, Split
from paternoster.tool_parsers import _harmony

ANALYSIS = "analysis"


def is_reasoning(msg: _harmony.Message) -> bool:
    """Whether a message (with its header read) belongs to the reasoning."""
    if msg.recipient is not None:
        return not msg.recipient.startswith("functions.")
    return msg.channel == ANALYSIS


class GptOssReasoningParser(ReasoningParser):
    """gpt-oss (gpt-oss-20b, gpt-oss-120b): harmony channels; see the module docstring."""

    name = "gpt_oss"
    skip_special_tokens = False
    end_text = _harmony.CHANNEL + "final" + _harmony.MESSAGE

    def __init__(self, tokenizer: Any | None = None):
        """Raises:
        ValueError: the tokenizer does not hold the harmony tags as single
            tokens: the model does not write harmony (a structured output
            would wait forever for the final channel; nothing would parse)."""
        super().__init__(tokenizer)
        if tokenizer is not None:
            for tag in (_harmony.CHANNEL, _harmony.MESSAGE):
                if len(tokenizer.encode(tag, add_special_tokens=False)) != 1:
                    raise ValueError(
                        f"the gpt_oss reasoning parser reads OpenAI's harmony format, but {tag!r} "
                        "is not one token of this model's tokenizer: the model is not gpt-oss")

    def gate_starts_in_reasoning(self, prompt_text: str) -> bool:
        """Always: every gpt-oss answer opens with a channel header, and only the
        final channel's message is the answer a grammar may constrain."""
        return True

    def starts_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the prompt ends inside an open analysis message (its last
        message has read ``<|channel|>analysis<|message|>`` and no terminator)."""
        i = prompt_text.rfind(_harmony.START)
        if i < 0:
            return False
        items = _harmony.scan(prompt_text[i:], False)
        last = items[-1] if items else None
        return (
            isinstance(last, _harmony.Message)
            and last.header_done
            and not last.closed
            and is_reasoning(last)
        )

    def split(self, text: str, in_reasoning: bool | None, final: bool) -> Split:
        """See :meth:`ReasoningParser.split` and the module docstring."""
        reasoning: list[str] = []
        content: list[str] = []
        ended = False
        for it in _harmony.scan(text, final, ANALYSIS if in_reasoning else None):
            if isinstance(it, str):
                content.append(it)
                ended = ended or bool(it)
            elif not it.header_done:
                break
            elif is_reasoning(it):
                reasoning.append(it.body)
            else:
                content.append(it.body if it.recipient is None else it.raw)
                ended = True
        return Split("".join(reasoning), "".join(content), ended)
