"""What one call to ``Scheduler.schedule()`` decides."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paternoster.request import Request


@dataclass
class SchedulerOutput:
    """The plan for one engine step.

    Attributes:
        scheduled: requests that compute tokens this step, in batch order.
        num_scheduled_tokens: tokens each of ``scheduled`` computes this step
            (same order), each >= 1; their sum never exceeds the token budget.
        preempted: requests preempted (recompute) while building this plan.
    """

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        """Sum of ``num_scheduled_tokens`` (tokens in this step's forward pass)."""
        return sum(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def add(self, request: Request, num_tokens: int) -> None:
        """Schedule ``num_tokens`` (>= 1) of ``request`` this step."""
        self.scheduled.append(request)
        self.num_scheduled_tokens.append(num_tokens)

    def batch_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrays the C++ ``BatchBuilder.build`` takes.

        Returns:
            ``(internal_ids int64[B], num_computed_tokens int32[B],
            num_scheduled_tokens int32[B])``.
        """
        ids = np.fromiter((r.internal_id for r in self.scheduled), np.int64, len(self.scheduled))
        computed = np.fromiter(
            (r.num_computed_tokens for r in self.scheduled), np.int32, len(self.scheduled)
        )
        scheduled = np.asarray(self.num_scheduled_tokens, dtype=np.int32)
        return ids, computed, scheduled
