"""Static batching: the pre-Orca baseline that refills only when the whole batch ends."""

from __future__ import annotations

from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.scheduler import Scheduler


class StaticBatchingScheduler(Scheduler):
    """Admit a batch of up to ``max_num_seqs`` waiting requests, then nothing
    more until every one of them has finished.

    A request that finishes early leaves its slot idle until the longest one
    ends: this is what continuous (iteration-level) batching (Orca, Yu et al.,
    OSDI'22) removes. Kept as a baseline for the simulator and tests; prompts
    are computed whole, as in :class:`FCFSScheduler`.
    """

    name = "static"

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit a new batch only when no request is running.

        Returns:
            The budget left.
        """
        if self.running:
            return budget
        return super().schedule_waiting(out, budget)
