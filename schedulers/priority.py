"""Priority scheduling with preemption and aging, on public hooks only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.policy import require_int
from paternoster.scheduling.request_queue import PriorityRequestQueue, RequestQueue
from paternoster.scheduling.scheduler import Scheduler


class PriorityScheduler(Scheduler):
    """Lower ``priority`` value runs first (vLLM's convention); ties by arrival.

    Waiting requests sit in a binary heap (:class:`PriorityRequestQueue`),
    admitted in rank order; nothing is re-sorted per step. When the best
    waiting request ranks strictly better than the worst running one and no
    sequence slot or KV room is free for it (:meth:`fits`), the worst running
    request (:meth:`select_victim`) is preempted (recompute: its blocks are
    freed, its generated tokens kept) until it fits. When KV blocks run out
    for running requests, the victim is the same: the lowest-priority running
    request, latest arrival among equals (vLLM v1's priority victim).
    Prompts are computed whole.

    Aging: a waiting request's effective priority improves by one level per
    ``aging_steps`` engine steps waited (by ``1 / aging_steps`` each step), so
    a low-priority request under a stream of high-priority ones still runs
    eventually. Every waiting request ages at the same rate, so their order
    never changes while they wait and the heap key is fixed when a request
    is queued: ``priority * aging_steps + step queued`` (a virtual deadline).
    A running request keeps the rank it was admitted with; a preempted one
    starts aging again from its own priority.

    Options (``--scheduler-config``):
        aging_steps: steps of waiting per priority level gained (``0``: no aging).
    Raises:
        ValueError: a negative ``aging_steps``.
    """

    name = "priority"
    default_options: ClassVar[dict[str, Any]] = {"aging_steps": 100}

    @classmethod
    def check_option_values(cls, options: Mapping[str, Any]) -> None:
        """``aging_steps`` must be an integer >= 0.

        Raises:
            ValueError: naming it.
        """
        require_int(options, "aging_steps")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # checks the options
        self.aging_steps = self.options["aging_steps"]
        self._waiting_since: dict[str, int] = {}
        self._admitted_rank: dict[str, int] = {}

    # ------------------------------------------------------------- ordering

    def rank(self, request: Request) -> int:
        """A request's place in line now, lower first, in units of
        ``1 / aging_steps`` priority levels (of whole levels without aging).

        Waiting: ``priority * aging_steps - steps waited``. Running: the rank
        it was admitted with.
        """
        rid = request.request_id
        if rid in self._admitted_rank:
            return self._admitted_rank[rid]
        if not self.aging_steps:
            return request.priority
        waited = self.num_steps - self._waiting_since.get(rid, self.num_steps)
        return request.priority * self.aging_steps - waited

    def _heap_key(self, request: Request) -> tuple[int, float]:
        # rank + num_steps stays constant while the request waits.
        offset = self.num_steps if self.aging_steps else 0
        return (self.rank(request) + offset, request.arrival_time)

    def create_waiting_queue(self) -> RequestQueue:
        """A heap keyed by rank (a constant while waiting), ties by arrival."""
        return PriorityRequestQueue(key=self._heap_key)

    def enqueue_waiting(self, request: Request) -> None:
        """Start the request's aging clock and push it on the heap."""
        self._waiting_since[request.request_id] = self.num_steps
        self.waiting.add_request(request)

    def requeue_preempted(self, request: Request) -> None:
        """Drop its admitted rank; it queues again like a new arrival of its priority."""
        self._admitted_rank.pop(request.request_id, None)
        self.enqueue_waiting(request)

    def select_victim(self, running: Sequence[Request]) -> Request:
        """The lowest-priority running request: highest rank, latest arrival
        among equals."""
        return max(running, key=lambda r: (self.rank(r), r.arrival_time))

    def on_admitted(self, request: Request) -> None:
        """Freeze the rank it was admitted with."""
        self._admitted_rank[request.request_id] = self.rank(request)
        self._waiting_since.pop(request.request_id, None)

    def on_finished(self, request: Request) -> None:
        """Forget its rank bookkeeping."""
        self._waiting_since.pop(request.request_id, None)
        self._admitted_rank.pop(request.request_id, None)

    # ------------------------------------------------------------- the step

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit in rank order; for each head of the heap, first preempt
        worse-ranked running requests until it fits (:meth:`make_room`).

        Returns:
            The budget left.
        """
        while self.waiting and budget > 0:
            head = self.waiting.peek_request()
            budget += self.make_room(head, out)
            num_new = self.admit(head, out, budget)
            if num_new == 0:
                break
            budget -= num_new
        return budget

    def make_room(self, head: Request, out: SchedulerOutput) -> int:
        """Preempt running requests ranked strictly worse than ``head`` (worst
        first) until ``head`` :meth:`fits`.

        Returns:
            The tokens the victims give back to this step's budget.
        """
        freed = 0
        rank = self.rank(head)
        while self.running and not self.fits(head):
            victim = self.select_victim(self.running)
            if self.rank(victim) <= rank:
                break
            freed += self.preempt(victim, out)
        return freed
