"""Chunked prefill: one token budget per step shared by decodes and prompt chunks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from paternoster.request import Request
from paternoster.scheduling.policy import require_int
from paternoster.scheduling.scheduler import Scheduler


class ChunkedPrefillScheduler(Scheduler):
    """Decodes first, then prompt chunks, all under ``max_num_batched_tokens``.

    Every step, running requests that are decoding get their one token first;
    the rest of the budget goes to prompt chunks (running requests whose
    prefill is unfinished, then new admissions in arrival order). A long
    prompt is split across steps, so running decodes keep flowing while it
    is prefilled (Sarathi-Serve, Agrawal et al., OSDI'24; vLLM's chunked
    prefill). ``max_num_batched_tokens`` may be smaller than
    ``max_model_len``.

    Options (``--scheduler-config``):
        long_prefill_token_threshold: most prompt tokens one request may
            compute in one step (tokens); ``0`` means "the whole budget".
    Raises:
        ValueError: a negative ``long_prefill_token_threshold``.
    """

    name = "chunked_prefill"
    supports_chunked_prefill = True
    default_options: ClassVar[dict[str, Any]] = {"long_prefill_token_threshold": 0}

    @classmethod
    def check_option_values(cls, options: Mapping[str, Any]) -> None:
        """``long_prefill_token_threshold`` must be an integer >= 0.

        Raises:
            ValueError: naming it.
        """
        require_int(options, "long_prefill_token_threshold")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # checks the options
        self.long_prefill_token_threshold = self.options["long_prefill_token_threshold"]

    def order_running(self, running: list[Request]) -> list[Request]:
        """Decoding requests first, then unfinished prefills (each in admission order)."""
        decoding = [r for r in running if r.num_tokens - r.num_computed_tokens == 1]
        prefilling = [r for r in running if r.num_tokens - r.num_computed_tokens != 1]
        return decoding + prefilling

    def can_admit(self, request: Request) -> bool:
        """Admit only when the whole prompt :meth:`fits` (room for all of it on
        top of what running prompts still need), not just its first chunk:
        allocating only the first chunk's blocks would admit requests that are
        then preempted again and again as their prompts grow (thrashing)."""
        return self.fits(request)

    def num_tokens_to_schedule(self, request: Request, token_budget: int) -> int:
        """All remaining tokens, cut to the budget and the per-request threshold."""
        n = min(request.num_tokens - request.num_computed_tokens, token_budget)
        if self.long_prefill_token_threshold:
            n = min(n, self.long_prefill_token_threshold)
        return n
