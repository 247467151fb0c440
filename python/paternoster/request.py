"""The engine-side request: token ids, progress and lifecycle status."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from paternoster.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request. Every finished state is numbered after the live ones,
    so ``status > RequestStatus.PREEMPTED`` means finished."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def finish_reason(status: RequestStatus) -> str | None:
        """The OpenAI ``finish_reason`` of a finished status, else ``None``."""
        return _FINISH_REASONS.get(status)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)
class Request:
    """One sequence the engine generates for.

    Progress is one number: ``num_computed_tokens`` (tokens whose KV is in the
    cache) chases ``num_tokens`` (prompt + generated). Prefill, chunked prefill
    and decode are the same thing seen at different distances from the end.

    Attributes:
        request_id: caller's id (str, unique among live requests).
        prompt_token_ids: prompt tokens (list of int).
        sampling_params: how to sample and when to stop.
        eos_token_id: the model's EOS id (ignored when ``ignore_eos``), or None.
        arrival_time: ``time.monotonic()`` seconds when the request arrived.
        priority: lower runs first (vLLM convention); FCFS ignores it.
        output_token_ids: generated tokens, kept across preemption.
        num_computed_tokens: tokens whose K/V are in the paged cache.
        num_preemptions: times this request was preempted (recompute).
        internal_id: small int id used by the C++ core (set by the scheduler).
        max_tokens: resolved output cap in tokens (set by the engine).
        generator: per-request ``torch.Generator`` when a seed was given.
        first_scheduled_time: ``time.monotonic()`` seconds when a step first
            scheduled it (``None`` while it has only waited); queue time is this
            minus ``arrival_time``.
        cache_salt: prefix-cache isolation: its blocks are shared only with
            requests of the same salt (``None``: no salt).
        tenant: who the request is served for (the OpenAI ``user`` field or
            the ``X-Tenant-Id`` header); the ``fair`` scheduler shares the
            engine between tenants. ``None``: the one anonymous tenant.
        grammar: its structured-output state
            (:class:`~paternoster.structured_outputs.GrammarState`, set by the
            engine when ``sampling_params.structured_outputs`` is), or None.
        slo_ttft_s: its own time-to-first-token target in seconds (the ``slo``
            scheduler; ``None``: the policy's default or its priority class's).
        slo_itl_s: its own inter-token latency target in seconds (likewise).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    internal_id: int = -1
    max_tokens: int = 16
    generator: torch.Generator | None = None
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    cache_salt: str | None = None
    grammar: Any = None
    tenant: str | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None

    def __post_init__(self) -> None:
        if self.sampling_params.seed is not None:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.sampling_params.seed)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    @property
    def finish_reason(self) -> str | None:
        return RequestStatus.finish_reason(self.status)


def check_slo_target(value: object, name: str) -> float | None:
    """A request's latency target (``slo_ttft_s``, ``slo_itl_s``): ``None`` or
    a finite number of seconds > 0, as a float.

    Raises:
        ValueError: anything else (a bool included), naming ``name``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)

