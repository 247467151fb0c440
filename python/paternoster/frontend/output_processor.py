"""Output processing: from engine outputs to text deltas.

A user request with ``n`` choices becomes ``n`` engine requests
(:func:`fan_out`); each engine request's :class:`EngineCoreOutput` stream goes
through one :class:`SequenceState`, which detokenizes incrementally, applies
stop strings and counts tokens. The results are :class:`ChoiceDelta` pieces
(for streaming) and, at the end, :class:`CompletionOutput`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.frontend.detokenizer import IncrementalDetokenizer, StopStringMatcher
from paternoster.logprobs import Logprobs
from paternoster.outputs import ChoiceDelta, CompletionOutput
from paternoster.sampling_params import SamplingParams


def fan_out(
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    first_index: int = 0,
    priority: int = 0,
    cache_salt: str | None = None,
    arrival_time: float | None = None,
    tenant: str | None = None,
    slo: tuple[float | None, float | None] = (None, None),
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
        priority: scheduling priority of every choice (lower runs first).
        cache_salt: prefix-cache salt of every choice (``None``: none).
        arrival_time: ``time.time()`` of the request's arrival (default: now).
        tenant: who every choice is served for (``None``: the anonymous tenant).
        slo: ``(slo_ttft_s, slo_itl_s)`` of every choice (``None``: the policy's).
    Returns:
        ``[(choice_index, EngineCoreRequest)]`` of length ``n``.
    """
    arrival = time.time() if arrival_time is None else arrival_time
    out = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        sub = params if params.n == 1 else dataclasses.replace(params, n=1, seed=seed)
        index = first_index + i
        req = EngineCoreRequest(
            request_id=f"{request_id}-{index}", prompt_token_ids=list(prompt_token_ids),
            sampling_params=sub, arrival_time=arrival, priority=priority, cache_salt=cache_salt,
            tenant=tenant,
            slo_ttft_s=slo[0], slo_itl_s=slo[1],
        )  # fmt: skip
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
