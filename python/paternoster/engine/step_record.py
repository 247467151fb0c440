"""StepRecord: one entry of the engine's step log (``EngineCore.step_log``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """What one engine step ran.

    Attributes:
        step: step index (0-based, counts steps that ran a forward pass).
        start: the engine clock's seconds (``time.monotonic()`` unless a clock
            was given) when the step began.
        duration: seconds of the whole step.
        overhead: seconds spent outside the runner (forward pass and sampling):
            schedule + batch build + update.
        request_ids: the scheduled requests' ids, batch order.
        num_scheduled_tokens: tokens each of them computed, same order.
        num_preempted: requests preempted while planning this step.
    """

    step: int
    start: float
    duration: float
    overhead: float
    request_ids: tuple[str, ...]
    num_scheduled_tokens: tuple[int, ...]
    num_preempted: int

    @property
    def scheduled(self) -> tuple[tuple[str, int], ...]:
        """``(request_id, num_scheduled_tokens)`` per request, batch order."""
        return tuple(zip(self.request_ids, self.num_scheduled_tokens))
