"""A third-party Paternoster scheduler: shortest prompt first."""

from __future__ import annotations

import bisect

from paternoster.scheduling.scheduler import Scheduler


class ShortestPromptFirstScheduler(Scheduler):
    """Admit waiting requests in order of prompt length (ties: arrival order)."""

    name = "shortest_prompt_first"

    def enqueue_waiting(self, request) -> None:
        keys = [r.num_prompt_tokens for r in self.waiting]
        self.waiting.insert(bisect.bisect_right(keys, request.num_prompt_tokens), request)
