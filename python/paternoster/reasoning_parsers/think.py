"""``<think>...</think>`` reasoning: DeepSeek-R1 and Qwen3.

Format (the DeepSeek-R1 and Qwen3 chat templates)::

    <think>
    The user asks for 2 + 2. That is 4.
    </think>

    The answer is 4.

The reasoning is the text between ``<think>`` and the first ``</think>``, the
content everything after that ``</think>``, both as the model wrote them (later
tags stay in the content). Where the prompt opened the block (DeepSeek-R1, and
Qwen3-Thinking-2507, end the prompt with ``<think>\\n``) the output starts
inside it and holds only ``</think>``; a ``<think>`` at the very start of the
output is accepted then too. An output that stops before ``</think>`` (the
length limit hit while thinking) is all reasoning.

The parsers differ in what they assume when ``in_reasoning`` is unknown
(``None``): see :class:`DeepSeekR1ReasoningParser` and :class:`Qwen3ReasoningParser`.
"""

from __future__ import annotations

from paternoster.reasoning_parsers.base import ReasoningParser, Split
from paternoster.tool_parsers.base import partial_tag_len

START = "<think>"
END = "</think>"


def reasoning_from(text: str, start: int, final: bool) -> Split:
    """Reasoning from ``start`` up to the first :data:`END`, content after it;
    without one, all reasoning (less a suffix that may begin :data:`END` unless
    ``final``)."""
    i = text.find(END, start)
    if i >= 0:
        return Split(text[start:i], text[i + len(END) :], True)
    body = text[start:]
    if not final:
        body = body[: len(body) - partial_tag_len(body, (END,))]
    return Split(body, "", False)


def opening(text: str, final: bool) -> int | None:
    """``len(START)`` when ``text`` opens with :data:`START`, 0 when it does not,
    ``None`` while it cannot tell yet (``text`` is a proper prefix of it)."""
    if text.startswith(START):
        return len(START)
    if not final and START.startswith(text):
        return None
    return 0


class ThinkReasoningParser(ReasoningParser):
    """``<think>reasoning</think>content``; subclasses set :attr:`default_in_reasoning`."""

    end_text = END
    start_text = START
    default_in_reasoning = True
    """What ``in_reasoning=None`` (unknown) means for this family."""

    def starts_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the last ``<think>`` of the prompt has no ``</think>`` after it.

        ``...<｜Assistant｜><think>\\n`` (DeepSeek-R1) and ``...assistant\\n<think>\\n``
        (Qwen3-Thinking-2507) give True; Qwen3's ``enable_thinking=False`` prompt,
        which ends with ``<think>\\n\\n</think>\\n\\n``, and prompts without the tag
        give False.
        """
        i = prompt_text.rfind(START)
        return i >= 0 and prompt_text.find(END, i) < 0

    def split(self, text: str, in_reasoning: bool | None, final: bool) -> Split:
        """See :meth:`ReasoningParser.split` and the module docstring."""
        opened = opening(text, final)
        if opened is None:
            return Split("", "", False)
        if in_reasoning is None:
            in_reasoning = self.default_in_reasoning
        if in_reasoning or opened:
            return reasoning_from(text, opened, final)
        return Split("", text, True)


class DeepSeekR1ReasoningParser(ThinkReasoningParser):
    """DeepSeek-R1 (and its distills): ``in_reasoning=None`` means True.

    The R1 templates end every prompt with ``<think>\\n``, so an output with no
    ``</think>`` is reasoning cut short, never a bare answer.
    """

    name = "deepseek_r1"
    default_in_reasoning = True


class Qwen3ReasoningParser(ThinkReasoningParser):
    """Qwen3 (hybrid thinking and Qwen3-Thinking-2507).

    ``in_reasoning=None`` means False, unless the output says otherwise: one that
    opens with ``<think>`` is reasoning up to ``</think>``, and one that holds a
    ``</think>`` with no ``<think>`` before it (Qwen3-Thinking-2507, whose
    template opens the block in the prompt) is reasoning up to that tag. Without
    either (``enable_thinking=False``), or with a ``<think>`` after the start
    and before any ``</think>``, the output is all content. While
    streaming with ``None`` such an output is held back until ``</think>`` or
    the end decides it, so pass ``in_reasoning`` from :meth:`starts_in_reasoning`
    to stream without that delay.
    """

    name = "qwen3"
    default_in_reasoning = False

    def split(self, text: str, in_reasoning: bool | None, final: bool) -> Split:
        """See :meth:`ReasoningParser.split` and the class docstring."""
        if in_reasoning is not None or opening(text, final) != 0:
            return super().split(text, in_reasoning, final)
        i, j = text.find(END), text.find(START)
        if i >= 0 and not 0 <= j < i:
            return Split(text[:i], text[i + len(END) :], True)
        if j >= 0 or final:  # a <think> not at the start: no reasoning block
            return Split("", text, True)
        return Split("", "", False)
