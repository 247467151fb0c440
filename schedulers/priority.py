"""Priority scheduling with preemption and aging."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.scheduler import Scheduler


class PriorityScheduler(Scheduler):
    """Lower ``priority`` value runs first (vLLM's convention); ties by arrival.

    Waiting requests are admitted in order of effective priority. When the
    best waiting request ranks strictly above the worst running one and no
    sequence slot or KV room is free for it, the worst running request is
    preempted (recompute: its blocks are freed, its generated tokens kept)
    until it fits. When KV blocks run out for running requests, the victim is
    the lowest-priority running request. Prompts are computed whole.

    Aging: a request's effective priority improves by one for every
    ``aging_steps`` engine steps it has waited, so a low-priority request
    under a stream of high-priority ones still runs eventually.

    Options (``--scheduler-config``):
        aging_steps: steps of waiting per priority level gained (``0``: no aging).
    Raises:
        ValueError: a negative ``aging_steps``.
    """

    name = "priority"
    default_options: ClassVar[dict[str, Any]] = {"aging_steps": 100}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        aging = self.options["aging_steps"]
        if not isinstance(aging, int) or aging < 0:
            raise ValueError(f"aging_steps must be an integer >= 0, got {aging!r}")
        self.aging_steps = aging
        self._waiting_since: dict[str, int] = {}
        self._admitted_rank: dict[str, int] = {}

    # ------------------------------------------------------------- ordering

    def effective_priority(self, request: Request) -> int:
        """``priority`` minus one per ``aging_steps`` steps spent waiting; a
        running request keeps the effective priority it was admitted with."""
        rid = request.request_id
        if rid in self._admitted_rank:
            return self._admitted_rank[rid]
        if not self.aging_steps or rid not in self._waiting_since:
            return request.priority
        waited = self.num_steps - self._waiting_since[rid]
        return request.priority - waited // self.aging_steps

    def _rank(self, request: Request) -> tuple[int, float]:
        return (self.effective_priority(request), request.arrival_time)

    def enqueue_waiting(self, request: Request) -> None:
        self._waiting_since.setdefault(request.request_id, self.num_steps)
        self.waiting.append(request)

    def select_victim(self, running: Sequence[Request]) -> Request:
        """The lowest-priority running request (latest arrival among equals)."""
        return max(running, key=lambda r: (self.effective_priority(r), r.arrival_time))

    # ------------------------------------------------------------- the step

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        self.waiting = deque(sorted(self.waiting, key=self._rank))
        while self.waiting:
            head = self.waiting[0]
            budget += self._make_room(head, out)
            before = len(self.waiting)
            super()._schedule_waiting(out, budget)
            admitted = before - len(self.waiting)
            if admitted == 0:
                return
            budget -= sum(out.num_scheduled_tokens[-admitted:])
            if not self.waiting or self.waiting[0] is head:
                return

    def _make_room(self, head: Request, out: SchedulerOutput) -> int:
        """Preempt lower-ranked running requests until ``head`` fits; returns
        the tokens given back to this step's budget."""
        freed = 0
        rank = self.effective_priority(head)
        while self.running and not self._fits(head):
            victim = self.select_victim(self.running)
            if self.effective_priority(victim) <= rank:
                break
            self.running.remove(victim)
            self._admitted_rank.pop(victim.request_id, None)
            freed += self._unschedule(out, victim)
            self._preempt(victim, out)
        return freed

    def _fits(self, request: Request) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        kv = self.kv_cache_manager
        return kv.num_required_blocks(request.internal_id, request.num_tokens) <= (
            kv.num_free_blocks()
        )

    def on_admitted(self, request: Request) -> None:
        self._admitted_rank[request.request_id] = self.effective_priority(request)
        self._waiting_since.pop(request.request_id, None)

    def on_finished(self, request: Request) -> None:
        self._waiting_since.pop(request.request_id, None)
        self._admitted_rank.pop(request.request_id, None)

    def requeue_preempted(self, request: Request) -> None:
        self._admitted_rank.pop(request.request_id, None)
        self.enqueue_waiting(request)
