"""What generation returns: per-choice deltas while it runs
(:class:`ChoiceDelta`), and per-prompt results at the end
(:class:`RequestOutput` of :class:`CompletionOutput` choices).

Produced by :mod:`paternoster.frontend.output_processor` for the servers and
the offline ``LLM`` alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paternoster.logprobs import Logprobs


@dataclass
class CompletionOutput:
    """One generated sequence (one choice).

    Attributes:
        index: choice index, ``0..n-1`` within its prompt.
        text: generated text, without the stop string or stop/EOS token.
        token_ids: every generated token delivered, including a final EOS or
            stop token and the token that completed a stop string.
        finish_reason: ``"stop"``, ``"length"`` or ``"abort"`` (``None`` while
            running).
        stop_reason: the stop string or stop token id that ended it, if any.
        logprobs: one position per entry of ``token_ids`` when
            ``SamplingParams.logprobs`` was set, else ``None``.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: Logprobs | None = None


@dataclass
class RequestOutput:
    """The result for one prompt.

    Attributes:
        request_id: id of the user request (engine ids append ``-<index>``).
        prompt: the prompt text, if the prompt was given as text.
        prompt_token_ids: the tokenized prompt.
        outputs: ``n`` choices ordered by index.
        finished: all choices finished.
        prompt_logprobs: prompt tokens ``1..P-1`` when
            ``SamplingParams.prompt_logprobs`` was set (the first token has none).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: Logprobs | None = None


@dataclass
class ChoiceDelta:
    """What one engine output added to one choice.

    Attributes:
        index: the choice index.
        text: new text (may be ``""`` while text is held back).
        token_ids: new token ids.
        finish_reason: set on the choice's last delta.
        stop_reason: the stop string or token id, on the last delta.
        logprobs: one position per entry of ``token_ids`` (when asked).
        prompt_logprobs: prompt tokens ``1..P-1``, on the first delta with a
            token (when asked).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None
