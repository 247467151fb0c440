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
        rejected: ``(request, reason)`` for waiting requests the policy
            finished with an error instead of running (``Scheduler.reject``).
    """

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    rejected: list[tuple[Request, str]] = field(default_factory=list)
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )

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
        self._arrays = None

    def remove(self, request: Request) -> int:
        """Take ``request`` out of the plan; returns its scheduled tokens (0 if
        it was not scheduled)."""
        if request not in self.scheduled:
            return 0
        idx = self.scheduled.index(request)
        self.scheduled.pop(idx)
        self._arrays = None
        return self.num_scheduled_tokens.pop(idx)

    def batch_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Arrays the C++ ``BatchBuilder.build`` takes.

        Built once for the finished plan and reused (the engine builds the
        batch from them and the scheduler's update caches prefix blocks with
        them); treat them as read-only.

        Returns:
            ``(internal_ids int64[B], num_computed_tokens int32[B],
            num_scheduled_tokens int32[B])``, ``num_computed_tokens`` as of
            planning (before the step ran).
        """
        if self._arrays is not None:
            return self._arrays
        ids = np.fromiter((r.internal_id for r in self.scheduled), np.int64, len(self.scheduled))
        computed = np.fromiter(
            (r.num_computed_tokens for r in self.scheduled), np.int32, len(self.scheduled)
        )
        scheduled = np.asarray(self.num_scheduled_tokens, dtype=np.int32)
        self._arrays = (ids, computed, scheduled)
        return self._arrays
