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
    admitted in rank order; nothing is re-sorted per step.

    Preemption cannot ping-pong: when no sequence slot or KV room is free for
    the head of the heap (:meth:`fits`), a running request is displaced
    (preempted by recompute: blocks freed, generated tokens kept) only if its
    base ``priority`` is *strictly* worse than the head's and it has not been
    displaced before; those are displaced worst first (:meth:`select_victim`)
    until the head fits. Requests of equal base priority never displace each
    other, whatever they aged, and no request is displaced twice (the
    hysteresis that bounds preemptions per request).
    When KV blocks run out for running requests the victim is the same: the
    worst base priority, then the worst rank, then the latest arrival (vLLM
    v1's priority victim). Prompts are computed whole.

    Aging orders the waiting queue only: a waiting request's rank improves by
    one priority level per ``aging_steps`` engine steps waited (by
    ``1 / aging_steps`` each step), so a low-priority request under a stream
    of high-priority ones reaches the head of the queue and runs at the next
    free slot; displaced once by a more urgent request, it is queued again
    with what it aged, runs at the next free slot, and is not displaced
    again, so it finishes. It never preempts a request of its own or better
    base priority. Every waiting request ages at the same rate, so their order
    never changes while they wait and the heap key is fixed when a request is
    queued: ``start rank + step queued`` (a virtual deadline), where the start
    rank is ``priority * aging_steps`` for a new request. A running request
    keeps the rank it was admitted with; a preempted one keeps what it aged
    (its start rank is the rank it was admitted with) and goes on aging.

    Bound: admission displaces a running request only for a waiting one of
    strictly more urgent base priority, and each request at most once, so
    the ping-pong of equal priorities that aging alone would cause (a
    waiting request outranks a running one, which is preempted, ages in turn
    and preempts back) cannot happen. The price: an urgent request finds no
    victim when every running request of worse priority was displaced
    before, and waits for a slot. A KV shortage among running requests still
    preempts (worst base priority first), as in every policy; that does not
    count as a displacement.

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
        self._start_rank: dict[str, int] = {}
        self._admitted_rank: dict[str, int] = {}
        self._displaced: set[str] = set()  # displaced once for an admission: never again

    # ------------------------------------------------------------- ordering

    def rank(self, request: Request) -> int:
        """A request's place in line now, lower first, in units of
        ``1 / aging_steps`` priority levels (of whole levels without aging).

        Waiting: its start rank (``priority * aging_steps`` when new, the rank
        it ran with when preempted) minus the steps waited since it was
        queued. Running: the rank it was admitted with.
        """
        rid = request.request_id
        if rid in self._admitted_rank:
            return self._admitted_rank[rid]
        if not self.aging_steps:
            return request.priority
        start = self._start_rank.get(rid, request.priority * self.aging_steps)
        waited = self.num_steps - self._waiting_since.get(rid, self.num_steps)
        return start - waited

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
        """Queue it again from the rank it ran with: it keeps what it aged."""
        rid = request.request_id
        rank = self._admitted_rank.pop(rid, None)
        if rank is not None and self.aging_steps:
            self._start_rank[rid] = rank
        self.enqueue_waiting(request)

    def select_victim(self, running: Sequence[Request]) -> Request:
        """The running request to give up first: worst base priority, then
        worst rank, then latest arrival."""
        return max(running, key=lambda r: (r.priority, self.rank(r), r.arrival_time))

    def on_admitted(self, request: Request) -> None:
        """Freeze the rank it was admitted with."""
        rid = request.request_id
        self._admitted_rank[rid] = self.rank(request)
        self._waiting_since.pop(rid, None)
        self._start_rank.pop(rid, None)

    def on_finished(self, request: Request) -> None:
        """Forget its rank bookkeeping."""
        rid = request.request_id
        self._waiting_since.pop(rid, None)
        self._start_rank.pop(rid, None)
        self._admitted_rank.pop(rid, None)
        self._displaced.discard(rid)

    # ------------------------------------------------------------- the step

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit in rank order; for each head of the heap, first preempt
        running requests of strictly worse base priority until it fits
        (:meth:`make_room`).

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
        """Displace running requests whose base priority is strictly worse
        than ``head``'s and that were not displaced before
        (:meth:`select_victim` order) until ``head`` :meth:`fits`; requests of
        ``head``'s priority or better are never displaced.

        Returns:
            The tokens the victims give back to this step's budget.
        """
        freed = 0
        while not self.fits(head):
            worse = [r for r in self.running
                     if r.priority > head.priority and r.request_id not in self._displaced]
            if not worse:
                break
            victim = self.select_victim(worse)
            self._displaced.add(victim.request_id)
            freed += self.preempt(victim, out)
        return freed
