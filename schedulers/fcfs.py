"""First come, first served with whole prompts (the default policy)."""

from __future__ import annotations

from paternoster.scheduling.scheduler import Scheduler


class FCFSScheduler(Scheduler):
    """Admit waiting requests in arrival order, each prompt computed in one step.

    Decodes of running requests are scheduled first; then waiting requests are
    admitted in arrival order while their whole remaining prompt fits the
    step's token budget, a sequence slot is free and KV blocks can be
    allocated; the first that does not fit stops admission (no overtaking).
    When KV blocks run out, the most recently admitted running request is
    preempted (recompute) and goes back to the front of the queue.
    Requires ``max_num_batched_tokens >= max_model_len``.
    """

    name = "fcfs"
