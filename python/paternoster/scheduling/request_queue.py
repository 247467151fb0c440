"""Waiting queues behind one interface: FIFO and priority heap.

After vLLM v1's ``vllm/v1/core/sched/request_queue.py``: the scheduler's loop
only peeks, pops, adds and removes; which request comes next is the queue's
business, so a policy changes the order by choosing a queue (the
``Scheduler.create_waiting_queue`` hook) instead of re-sorting a list every
step.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from paternoster.request import Request


class RequestQueue(ABC):
    """The waiting requests of a scheduler, in the order they should be admitted.

    Every implementation keeps these meanings: ``peek_request`` returns the
    request ``pop_request`` would take; iteration visits requests in that same
    order without consuming them; ``len`` counts the queued requests.
    """

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue ``request`` in its place according to the queue's order.

        Args:
            request: a request that is not in this queue.
        """

    @abstractmethod
    def prepend_request(self, request: Request) -> None:
        """Queue ``request`` ahead of the others where the order allows it
        (used for preempted requests).

        Args:
            request: a request that is not in this queue.
        """

    @abstractmethod
    def peek_request(self) -> Request:
        """The next request, left in the queue.

        Raises:
            IndexError: the queue is empty.
        """

    def pop_request(self) -> Request:
        """Take the next request out of the queue (default: the one
        :meth:`peek_request` names, through :meth:`remove_request`).

        Raises:
            IndexError: the queue is empty.
        """
        request = self.peek_request()
        self.remove_request(request)
        return request

    @abstractmethod
    def remove_request(self, request: Request) -> None:
        """Take ``request`` out of the queue, wherever it is.

        Raises:
            ValueError: ``request`` is not in the queue.
        """

    @abstractmethod
    def __contains__(self, request: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]: ...

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(deque, RequestQueue):
    """First come, first served: new requests at the back, preempted ones at the front.

    It is a ``collections.deque`` (as in vLLM v1, and as ``Scheduler.waiting``
    was in contract version 1), so a policy may also place a request at a
    position of its own choosing with ``insert``; every operation at either
    end is O(1).
    """

    def add_request(self, request: Request) -> None:
        """Append ``request`` at the back."""
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        """Put ``request`` at the front."""
        self.appendleft(request)

    def peek_request(self) -> Request:
        """The request at the front.

        Raises:
            IndexError: the queue is empty.
        """
        return self[0]

    def pop_request(self) -> Request:
        """Take the request at the front.

        Raises:
            IndexError: the queue is empty.
        """
        return self.popleft()

    def remove_request(self, request: Request) -> None:
        """Take ``request`` out (O(1) at the front, O(n) elsewhere).

        Raises:
            ValueError: ``request`` is not in the queue.
        """
        if self and self[0] is request:
            self.popleft()
        else:
            self.remove(request)


def default_priority_key(request: Request) -> tuple[int, float]:
    """``(priority, arrival_time)``: lower value first, ties by arrival (vLLM's order)."""
    return (request.priority, request.arrival_time)


class PriorityRequestQueue(RequestQueue):
    """A binary heap ordered by ``key(request)``, ties by insertion order.

    ``add_request`` and ``pop_request`` are O(log n), ``peek_request`` and
    ``remove_request`` O(1) amortized: removal leaves a tombstone that is
    dropped when it reaches the top, and the heap is rebuilt when tombstones
    outnumber live entries (the lazy deletion of Python's ``heapq``
    documentation). Iteration sorts a copy (O(n log n)); the scheduler's loop
    never iterates.

    Args:
        key: a request's place in the order, computed once when the request
            is queued (so it must not depend on anything that changes while
            the request waits relative to the other waiting requests); lower
            comes first. Default: :func:`default_priority_key`.
    """

    def __init__(self, key: Callable[[Request], Any] = default_priority_key) -> None:
        self._key = key
        self._heap: list[list[Any]] = []  # [key, seq, request or None (removed)]
        self._entries: dict[str, list[Any]] = {}  # request_id -> its live heap entry
        self._seq = itertools.count()

    def add_request(self, request: Request) -> None:
        """Push ``request`` at the place its key gives it.

        Raises:
            ValueError: a request with this ``request_id`` is already queued.
        """
        if request.request_id in self._entries:
            raise ValueError(f"request {request.request_id!r} is already queued")
        entry = [self._key(request), next(self._seq), request]
        self._entries[request.request_id] = entry
        heapq.heappush(self._heap, entry)

    def prepend_request(self, request: Request) -> None:
        """Same as :meth:`add_request`: in a priority order the key decides the
        place, a preempted request included."""
        self.add_request(request)

    def peek_request(self) -> Request:
        """The request with the lowest key.

        Raises:
            IndexError: the queue is empty.
        """
        self._drop_removed_top()
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][2]

    def pop_request(self) -> Request:
        """Take the request with the lowest key.

        Raises:
            IndexError: the queue is empty.
        """
        request = self.peek_request()
        heapq.heappop(self._heap)
        del self._entries[request.request_id]
        return request

    def remove_request(self, request: Request) -> None:
        """Take ``request`` out wherever it is (lazy deletion).

        Raises:
            ValueError: ``request`` is not in the queue.
        """
        if request not in self:
            raise ValueError(f"request {request.request_id!r} is not queued")
        if self._heap[0][2] is request:
            self.pop_request()
            return
        self._entries.pop(request.request_id)[2] = None
        if len(self._heap) > 2 * len(self._entries) + 16:
            self._heap = list(self._entries.values())
            heapq.heapify(self._heap)

    def _drop_removed_top(self) -> None:
        while self._heap and self._heap[0][2] is None:
            heapq.heappop(self._heap)

    def __contains__(self, request: object) -> bool:
        if not isinstance(request, Request):
            return False
        entry = self._entries.get(request.request_id)
        return entry is not None and entry[2] is request

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        """The queued requests in pop order (a sorted copy; the heap is untouched)."""
        return (entry[2] for entry in sorted(self._entries.values(), key=lambda e: e[:2]))
