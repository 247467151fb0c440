"""A waiting queue shared fairly between tenants by virtual token counters.

After the Virtual Token Counter (VTC) of Sheng et al., "Fairness in Serving
Large Language Models" (OSDI'24, arXiv:2401.00588), Algorithm 1, and its
artifact's queue (``slora/server/router/vtc_req_queue.py`` in
github.com/Ying1123/VTC-artifact): every tenant has a counter of the service
it received; each tenant's waiting requests form a FIFO; the next request is
the head of the *backlogged* tenant (one with a waiting request) whose counter
is the smallest. The scheduler charges the counters as tokens are computed
(:meth:`TenantFairQueue.charge`); the queue keeps the counter-lift rule.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from paternoster.request import Request
from paternoster.scheduling.request_queue import RequestQueue

Tenant = str | None
"""A tenant's name; ``None`` is the one anonymous tenant."""


class TenantFairQueue(RequestQueue):
    """Per-tenant FIFOs, the smallest virtual token counter first.

    **Counter lift**: when a tenant becomes backlogged (its first waiting
    request arrives, or a preempted one comes back to an empty FIFO), its
    counter is raised to the smallest counter among the tenants already
    backlogged (VTC's Algorithm 1; the artifact's ``append``), so a tenant
    that was idle banks no credit it could later spend starving the others.
    When no tenant is backlogged, it is raised to the counter the last
    backlogged tenant had when the queue emptied (this is our reading of the
    algorithm's idle case; the artifact leaves the counter as it is there).
    Counters never decrease.

    Order: :meth:`peek_request` is the head of the backlogged tenant with the
    smallest counter, ties to the one charged or queued longest ago (round
    robin among equals). With the counters as they are, popping empties that
    tenant's FIFO first, so iteration yields tenants by counter, each FIFO in
    order. The smallest counter is found through a heap with one live entry
    per backlogged tenant (a charge pushes a fresh one, stale ones are dropped
    when they surface): O(log T) per charge and per tenant change, for T
    backlogged tenants. Membership is by ``request_id`` (O(1)).
    """

    def __init__(self) -> None:
        #: Virtual token counter of every tenant seen and not yet forgotten.
        self.counters: dict[Tenant, float] = {}
        self._fifos: dict[Tenant, deque[Request]] = {}  # backlogged tenants only
        self._heap: list[tuple[float, int, Tenant]] = []  # (counter, seq, tenant)
        self._live_seq: dict[Tenant, int] = {}  # tenant -> seq of its live heap entry
        self._seq = itertools.count()
        self._ids: dict[str, Request] = {}
        self._last_left = 0.0  # counter of the tenant that emptied the queue last

    # ------------------------------------------------------------- counters

    def charge(self, tenant: Tenant, amount: float) -> None:
        """Add ``amount`` (>= 0) of service to ``tenant``'s counter."""
        self.counters[tenant] = self.counters.get(tenant, 0.0) + amount
        if tenant in self._fifos:
            self._push(tenant)

    def counter(self, tenant: Tenant) -> float:
        """``tenant``'s counter (0 for a tenant not seen or forgotten)."""
        return self.counters.get(tenant, 0.0)

    def floor(self) -> float:
        """The value a tenant becoming backlogged now is lifted to: the smallest
        counter among backlogged tenants, or the last one's when none is. It
        never decreases, so a counter at or below it can be forgotten for free
        (:meth:`forget`)."""
        tenant = self._min_tenant()
        return self._last_left if tenant is _NONE else self.counters[tenant]

    def is_backlogged(self, tenant: Tenant) -> bool:
        """Whether ``tenant`` has a waiting request."""
        return tenant in self._fifos

    def forget(self, tenant: Tenant) -> bool:
        """Drop an idle tenant's counter when it is at or below :meth:`floor`
        (it would be lifted to at least that on return, so nothing is lost).

        Returns:
            Whether it was dropped (never while the tenant is backlogged).
        """
        if tenant in self._fifos or self.counters.get(tenant, 0.0) > self.floor():
            return False
        self.counters.pop(tenant, None)
        return True

    # -------------------------------------------------------- RequestQueue

    def add_request(self, request: Request) -> None:
        """Queue ``request`` at the back of its tenant's FIFO (lifting the
        tenant's counter if it was not backlogged).

        Raises:
            ValueError: a request with this ``request_id`` is already queued.
        """
        self._fifo_for(request).append(request)

    def prepend_request(self, request: Request) -> None:
        """Queue ``request`` at the front of its tenant's FIFO (a preempted
        request goes first among its tenant's).

        Raises:
            ValueError: a request with this ``request_id`` is already queued.
        """
        self._fifo_for(request).appendleft(request)

    def peek_request(self) -> Request:
        """The head of the backlogged tenant with the smallest counter.

        Raises:
            IndexError: the queue is empty.
        """
        tenant = self._min_tenant()
        if tenant is _NONE:
            raise IndexError("peek from an empty queue")
        return self._fifos[tenant][0]

    def remove_request(self, request: Request) -> None:
        """Take ``request`` out wherever it is (O(1) at a tenant's head).

        Raises:
            ValueError: ``request`` is not in the queue.
        """
        if request not in self:
            raise ValueError(f"request {request.request_id!r} is not queued")
        del self._ids[request.request_id]
        tenant = request.tenant
        fifo = self._fifos[tenant]
        if fifo[0] is request:
            fifo.popleft()
        else:
            fifo.remove(request)
        if not fifo:
            del self._fifos[tenant]
            del self._live_seq[tenant]
            if not self._fifos:
                self._last_left = self.counters[tenant]

    def __contains__(self, request: object) -> bool:
        if not isinstance(request, Request):
            return False
        return self._ids.get(request.request_id) is request

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[Request]:
        """Queued requests in pop order at the current counters: tenants by
        (counter, heap order), each tenant's FIFO front to back."""
        order = sorted(self._fifos, key=lambda t: (self.counters[t], self._live_seq[t]))
        return (r for t in order for r in self._fifos[t])

    # ------------------------------------------------------------ internals

    def _fifo_for(self, request: Request) -> deque[Request]:
        if request.request_id in self._ids:
            raise ValueError(f"request {request.request_id!r} is already queued")
        tenant = request.tenant
        if tenant not in self._fifos:  # becomes backlogged: the counter lift
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), self.floor())
            self._fifos[tenant] = deque()
            self._push(tenant)
        self._ids[request.request_id] = request
        return self._fifos[tenant]

    def _push(self, tenant: Tenant) -> None:
        seq = next(self._seq)
        self._live_seq[tenant] = seq
        heapq.heappush(self._heap, (self.counters[tenant], seq, tenant))
        if len(self._heap) > 2 * len(self._fifos) + 64:  # mostly stale entries: rebuild
            self._heap = [(self.counters[t], s, t) for t, s in self._live_seq.items()]
            heapq.heapify(self._heap)

    def _min_tenant(self) -> Tenant | object:
        """The backlogged tenant with the smallest counter, or ``_NONE``."""
        heap = self._heap
        while heap:
            _, seq, tenant = heap[0]
            if self._live_seq.get(tenant) == seq:
                return tenant
            heapq.heappop(heap)  # the tenant left, or was charged since
        return _NONE


_NONE = object()  # "no tenant" (``None`` is the anonymous tenant's name)
