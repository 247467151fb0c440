"""The reasoning-parser interface: model text in, ``reasoning`` and ``content`` out.

A reasoning model writes its chain of thought before its answer, between tags
(``<think>...</think>``) or in channels (gpt-oss's harmony format). A parser
splits a complete generation into the two (:meth:`ReasoningParser.extract`), or
does the same incrementally from text deltas (:class:`StreamingReasoningParser`),
yielding the ``reasoning`` and ``content`` fragments of OpenAI-style deltas.

Where the generation starts: a chat template may open the reasoning block in the
prompt itself (DeepSeek-R1 and Qwen3-Thinking-2507 end the prompt with
``<think>\\n``), so the output holds no start tag. The caller asks
:meth:`ReasoningParser.starts_in_reasoning` on the rendered prompt and passes the
answer as ``in_reasoning``; ``None`` means unknown, and each parser documents
what it assumes then.

Text: the reasoning is the text between the tags as the model wrote it, the
content the text after the end tag as the model wrote it (the tags themselves go;
no whitespace is stripped, as in vLLM, so the ``"\\n\\n"`` Qwen3 writes after
``</think>`` starts the content). An empty field is ``None``.

Streaming contract: for every split of a text into deltas, the streamed reasoning
fragments concatenate to ``extract``'s reasoning and the streamed content
fragments to its content. A tag split across deltas (``"</thi"`` + ``"nk>"``) is
held back until it is decided and never appears in either field. Each parser
implements :meth:`ReasoningParser.split`, a pure function of the whole text so
far whose results only grow, and both paths are built on it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class ExtractedReasoning:
    """What :meth:`ReasoningParser.extract` found; ``None`` for an empty field."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True)
class ReasoningDelta:
    """What one fed delta produced: new ``reasoning`` and ``content`` text.

    Falsy when it carries nothing (nothing to send to the client).
    """

    reasoning: str | None = None
    content: str | None = None

    def __bool__(self) -> bool:
        return bool(self.reasoning) or bool(self.content)


@dataclass(frozen=True)
class Split:
    """A split of the text so far, as :meth:`ReasoningParser.split` reports it.

    ``reasoning`` and ``content`` are what no continuation of the text can change
    (a later split of a longer text starts with them); ``ended`` is True once the
    answer part has begun (the end tag, or a non-reasoning message, was read).
    """

    reasoning: str
    content: str
    ended: bool


class ReasoningParser(ABC):
    """Base class of the reasoning parsers of one model family's format.

    Subclasses set :attr:`name` and :attr:`end_text` and implement
    :meth:`starts_in_reasoning` and :meth:`split`.

    Args:
        tokenizer: the model's Hugging Face tokenizer (optional); only
            :meth:`end_token_ids` uses it, to find the end marker's token ids.
    """

    name: ClassVar[str] = ""
    skip_special_tokens: ClassVar[bool] = True
    """Whether the output may be detokenized with special tokens skipped: False
    when the format's tags are special tokens that would then vanish (harmony)."""
    end_text: ClassVar[str] = ""
    """The text that marks the end of the reasoning (see :meth:`reasoning_end_text`)."""

    def __init__(self, tokenizer: Any | None = None):
        self.tokenizer = tokenizer

    @abstractmethod
    def starts_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the rendered prompt leaves the model inside an open reasoning
        block, so that its output begins with reasoning and holds no start tag."""

    @abstractmethod
    def split(self, text: str, in_reasoning: bool | None, final: bool) -> Split:
        """Split ``text`` (the whole generation so far) into reasoning and content.

        With ``final`` False the text may still grow: only what no continuation
        can change may be reported (hold back a partial tag, an undecided start).
        With ``final`` True everything is reported. ``in_reasoning`` is as in
        :meth:`extract`.
        """

    def safe_split(self, text: str, in_reasoning: bool | None, final: bool) -> Split:
        """:meth:`split`, falling back to all-content (when ``final``) if it raises."""
        try:
            return self.split(text, in_reasoning, final)
        except Exception:  # a parser bug must not fail the request: keep the text
            return Split("", text, True) if final else Split("", "", False)

    def reasoning_end_text(self) -> str:
        """The exact text that ends the reasoning, e.g. ``"</think>"``; what
        follows it in the output is the answer."""
        return self.end_text

    def end_token_ids(self) -> list[int] | None:
        """The token ids of :meth:`reasoning_end_text` from the tokenizer, or
        ``None`` without a tokenizer.

        The engine starts a grammar constraint only after the output's token ids
        contain this sequence. It matches what the model generates when the marker
        is one added token (``</think>`` in DeepSeek-R1 and Qwen3) or a sequence of
        special and whole-word tokens (harmony's ``<|channel|>final<|message|>``);
        a marker the tokenizer splits into ordinary pieces may be tokenized
        differently in context.
        """
        if self.tokenizer is None:
            return None
        return list(self.tokenizer.encode(self.reasoning_end_text(), add_special_tokens=False))

    #: The text that opens a reasoning block the model writes itself, or None.
    start_text: ClassVar[str | None] = None

    def grammar_gate(self, prompt_text: str) -> dict[str, Any] | None:
        """The ``reasoning`` entry of a structured-output spec for a request
        whose rendered prompt is ``prompt_text``: the engine then holds the
        grammar back until the reasoning ends (see
        :mod:`paternoster.reasoning_gate`), so a schema or a forced tool call
        constrains the answer, never the reasoning.

        Returns:
            ``{"end": ids, "start": [id] or [], "in_reasoning": bool}``; ``start``
            is set when :attr:`start_text` is one token. ``None`` without a
            tokenizer or an end marker.
        """
        end = self.end_token_ids()
        if not end:
            return None
        start: list[int] = []
        if self.start_text and self.tokenizer is not None:
            ids = list(self.tokenizer.encode(self.start_text, add_special_tokens=False))
            start = ids if len(ids) == 1 else []
        return {"end": end, "start": start,
                "in_reasoning": self.gate_starts_in_reasoning(prompt_text)}  # fmt: skip

    def gate_starts_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the grammar waits for the end marker from the first token
        (default: :meth:`starts_in_reasoning`)."""
        return self.starts_in_reasoning(prompt_text)

    def extract(self, text: str, *, in_reasoning: bool | None = None) -> ExtractedReasoning:
        """Split a complete generation into reasoning and content.

        Args:
            text: the generated text (detokenized as :attr:`skip_special_tokens` says).
            in_reasoning: :meth:`starts_in_reasoning` of the prompt; ``None``
                (unknown) takes the parser's documented default.

        Returns:
            The reasoning and the content, ``None`` where empty. Never raises.
        """
        s = self.safe_split(text, in_reasoning, True)
        return ExtractedReasoning(s.reasoning or None, s.content or None)

    def streaming(self, *, in_reasoning: bool | None = None) -> StreamingReasoningParser:
        """A fresh incremental parser for one generation (see
        :class:`StreamingReasoningParser`); ``in_reasoning`` as in :meth:`extract`."""
        return StreamingReasoningParser(self, in_reasoning=in_reasoning)


class StreamingReasoningParser:
    """Incremental splitting of one generation: :meth:`feed` deltas, then :meth:`finish`.

    Each call returns a :class:`ReasoningDelta` with the new reasoning and content
    text; text that may still be a tag is held back until it is decided.

    Args:
        parser: the format's :class:`ReasoningParser`.
        in_reasoning: as in :meth:`ReasoningParser.extract`.
    """

    def __init__(self, parser: ReasoningParser, *, in_reasoning: bool | None = None):
        self.parser = parser
        self.in_reasoning = in_reasoning
        self._text = ""
        self._sent = Split("", "", False)
        self._finished = False

    @property
    def text(self) -> str:
        """All the text fed so far."""
        return self._text

    @property
    def reasoning_ended(self) -> bool:
        """True once the answer part has begun: from then on the content is the
        answer, where tool-call parsing and structured output apply."""
        return self._sent.ended

    def feed(self, delta: str) -> ReasoningDelta:
        """Add generated text; returns what can be sent for it (possibly nothing).

        Raises:
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not delta:
            return ReasoningDelta()
        self._text += delta
        return self._advance(self.parser.safe_split(self._text, self.in_reasoning, False))

    def finish(self) -> ReasoningDelta:
        """End of generation: flush what was held back (a truncated tag is text)."""
        if self._finished:
            return ReasoningDelta()
        self._finished = True
        return self._advance(self.parser.safe_split(self._text, self.in_reasoning, True))

    def _advance(self, s: Split) -> ReasoningDelta:
        sent = self._sent
        # A field whose text does not extend what was sent (only a parser bug can
        # do that) sends nothing more.
        reasoning = s.reasoning if s.reasoning.startswith(sent.reasoning) else sent.reasoning
        content = s.content if s.content.startswith(sent.content) else sent.content
        self._sent = Split(reasoning, content, sent.ended or s.ended)
        return ReasoningDelta(
            reasoning[len(sent.reasoning) :] or None, content[len(sent.content) :] or None
        )
