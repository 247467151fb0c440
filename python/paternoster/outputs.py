"""Output processing shared by the HTTP server and the offline ``LLM``.

A user request with ``n`` choices becomes ``n`` engine requests
(:func:`fan_out`); each engine request's :class:`EngineCoreOutput` stream goes
through one :class:`SequenceState`, which detokenizes incrementally, applies
stop strings and counts tokens. The results are :class:`ChoiceDelta` pieces
(for streaming) and, at the end, :class:`CompletionOutput` /
:class:`RequestOutput`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from paternoster.detokenizer import IncrementalDetokenizer, StopStringMatcher
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.logprobs import Logprobs
from paternoster.sampling_params import SamplingParams


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


def fan_out(
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    first_index: int = 0,
    max_model_len: int | None = None,
    priority: int = 0,
) -> list[tuple[int, EngineCoreRequest]]:
    """Split a request with ``params.n`` choices into ``n`` engine requests.

    Choice ``i`` gets id ``f"{request_id}-{first_index + i}"``, ``n=1`` and,
    when ``params.seed`` is set, seed ``seed + i`` (so choices differ but the
    whole request is reproducible).

    Args:
        request_id: the user request's id.
        prompt_token_ids: the tokenized prompt.
        params: validated sampling parameters.
        first_index: index of the first choice (for several prompts in one
            HTTP request, prompt ``p`` starts at ``p * n``).
        max_model_len: when given and ``params.max_tokens`` is ``None``, each
            choice gets ``max_model_len - len(prompt_token_ids)`` tokens.
        priority: scheduling priority of every choice (lower runs first).
    Returns:
        ``[(choice_index, EngineCoreRequest)]`` of length ``n``.
    """
    max_tokens = params.max_tokens
    if max_tokens is None and max_model_len is not None:
        max_tokens = max(1, max_model_len - len(prompt_token_ids))
    out = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        sub = dataclasses.replace(params, n=1, seed=seed, max_tokens=max_tokens)
        index = first_index + i
        req = EngineCoreRequest(
            f"{request_id}-{index}", list(prompt_token_ids), sub, priority=priority
        )
        out.append((index, req))
    return out


class SequenceState:
    """Turns one engine request's outputs into text deltas.

    Args:
        index: the choice index reported in deltas.
        tokenizer: Hugging Face tokenizer used to decode.
        prompt_token_ids: the prompt (context for the detokenizer).
        params: the sequence's sampling params (``stop``,
            ``include_stop_str_in_output``, ``skip_special_tokens``,
            ``min_tokens`` and ``logprobs`` are used).
        skip_special_tokens: overrides ``params.skip_special_tokens`` when given.
    """

    def __init__(
        self,
        index: int,
        tokenizer: Any,
        prompt_token_ids: list[int],
        params: SamplingParams,
        skip_special_tokens: bool | None = None,
    ):
        self.index = index
        if skip_special_tokens is None:
            skip_special_tokens = params.skip_special_tokens
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
        self.stops = StopStringMatcher(params.stop, params.include_stop_str_in_output)
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: Logprobs | None = Logprobs() if params.logprobs is not None else None
        self.prompt_logprobs: Logprobs | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.needs_abort = False

    @property
    def finished(self) -> bool:
        """True once the sequence has its finish reason."""
        return self.finish_reason is not None

    def process(self, out: EngineCoreOutput) -> ChoiceDelta:
        """Apply one engine output.

        Args:
            out: the engine output for this sequence.
        Returns:
            The delta. If a stop string ended the sequence while the engine
            was still generating, :attr:`needs_abort` becomes True: the caller
            must abort the engine request. Outputs after the end are ignored
            (empty delta).
        """
        if self.finished:
            return ChoiceDelta(self.index, "", [])
        ids = list(out.new_token_ids)
        self.token_ids.extend(ids)
        if self.logprobs is not None and out.logprobs is not None:
            self.logprobs.extend(out.logprobs)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        engine_done = out.finish_reason is not None
        # An engine-side "stop" is EOS or a stop token id: it ends the sequence
        # but is not part of its text (unless include_stop_str_in_output).
        stop_token = out.finish_reason == "stop" and not self.include_stop
        text_ids = ids[:-1] if stop_token else ids
        text = self.detokenizer.add(text_ids) if text_ids else ""
        if engine_done:
            text += self.detokenizer.flush()
        if len(self.token_ids) <= self.min_tokens:
            safe, matched = text, None  # stop strings count from min_tokens on (vLLM)
        else:
            safe, matched = self.stops.feed(text)
        if matched is not None:
            self.finish_reason, self.stop_reason = "stop", matched
            self.needs_abort = not engine_done
        elif engine_done:
            safe += self.stops.flush()
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason
        self.text += safe
        return ChoiceDelta(
            self.index, safe, ids, self.finish_reason, self.stop_reason,
            out.logprobs if self.logprobs is not None else None, out.prompt_logprobs,
        )  # fmt: skip

    def to_output(self) -> CompletionOutput:
        """The choice so far as a :class:`CompletionOutput`."""
        return CompletionOutput(
            self.index, self.text, list(self.token_ids), self.finish_reason, self.stop_reason,
            self.logprobs,
        )  # fmt: skip
