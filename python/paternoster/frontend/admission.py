"""Admission control: a bounded waiting queue in front of the engine.

A request counts as *waiting* from the moment it is sent to the engine until
its first output arrives (queued in the engine or still in prefill).
:meth:`Admission.check_capacity` refuses new work with
:class:`EngineOverloadedError` once ``max_waiting_requests`` or
``max_waiting_tokens`` (prompt tokens) would be exceeded; work it admits holds
a :class:`Reservation` of its room at once, in the same step as the check, so
a burst admitted in one event-loop turn cannot overshoot a limit. Sending a
request turns one share of its reservation into a waiting entry
(:meth:`Admission.start_waiting`); whatever is never sent goes back with
:meth:`Reservation.release`.
"""

from __future__ import annotations

import contextlib
import logging

from paternoster.frontend.errors import EngineOverloadedError

logger = logging.getLogger("paternoster.frontend")


class Reservation:
    """Room in the waiting queue, set aside by :meth:`Admission.check_capacity`
    for requests not sent yet.

    It counts against ``max_waiting_requests`` and ``max_waiting_tokens`` like
    requests that wait. Sending a request takes one request's share of it
    (:meth:`take`; the request then waits instead); :meth:`release` gives back
    what is left, so call it (or leave a ``with`` block) on every path where
    some of the requests are never sent: a validation error, a client that
    disconnected, a cancellation. Releasing twice, or after everything was
    taken, does nothing. A reservation dropped without a release gives its
    room back when it is garbage-collected (and logs a warning: a code path
    forgot to release it).

    Not created directly: :meth:`Admission.check_capacity` returns it.
    """

    def __init__(self, admission: Admission, num_requests: int, num_tokens: int):
        self._requests = self._tokens = 0  # until counted below (see __del__)
        self._admission = admission
        admission.reserved_requests += num_requests
        admission.reserved_tokens += num_tokens
        self._requests, self._tokens = num_requests, num_tokens

    @property
    def num_requests(self) -> int:
        """Requests still reserved (not sent, not released)."""
        return self._requests

    @property
    def num_tokens(self) -> int:
        """Prompt tokens still reserved."""
        return self._tokens

    def take(self, num_tokens: int) -> None:
        """Hand one request's share (one request, ``num_tokens`` prompt tokens;
        the last request takes every token left) back to the admission
        counts, which count that request as waiting instead. Does nothing once
        nothing is left.

        Args:
            num_tokens: the request's prompt tokens.
        """
        if self._requests <= 0:
            return
        tokens = self._tokens if self._requests == 1 else min(max(num_tokens, 0), self._tokens)
        self._requests -= 1
        self._tokens -= tokens
        self._admission.unreserve(1, tokens)

    def release(self) -> None:
        """Give back the room of every request not sent yet. Idempotent; never raises."""
        requests, tokens = self._requests, self._tokens
        self._requests = self._tokens = 0
        if requests or tokens:
            self._admission.unreserve(requests, tokens)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __del__(self) -> None:
        requests, tokens = self._requests, self._tokens
        if not (requests or tokens):
            return
        self._requests = self._tokens = 0
        with contextlib.suppress(Exception):  # never raise from a finalizer
            logger.warning("a reservation of %d requests was never released; releasing it now",
                           requests)  # fmt: skip
            self._admission.unreserve(requests, tokens)


class Admission:
    """The waiting queue's limits and counts.

    Args:
        max_waiting_requests: most requests waiting for their first output
            (``None``: unbounded).
        max_waiting_tokens: most prompt tokens of waiting requests (``None``:
            unbounded).
    Raises:
        ValueError: a limit <= 0, naming it.
    """

    def __init__(self, max_waiting_requests: int | None = None,
                 max_waiting_tokens: int | None = None):  # fmt: skip
        for name, value in (("max_waiting_requests", max_waiting_requests),
                            ("max_waiting_tokens", max_waiting_tokens)):  # fmt: skip
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (or None for no limit), got {value}")
        self.max_waiting_requests = max_waiting_requests
        self.max_waiting_tokens = max_waiting_tokens
        self.waiting: dict[str, int] = {}  # request id -> prompt tokens, until first output
        self.waiting_tokens = 0
        self.reserved_requests = 0  # admitted, not sent yet
        self.reserved_tokens = 0

    def check_capacity(self, num_requests: int, num_tokens: int) -> Reservation:
        """Admit new work unless it would overfill the waiting queue, and reserve
        its room in the same step.

        Requests already waiting and requests admitted but not sent yet (held
        in reservations) both count, so however many checks run before any of
        their requests is sent, no more than the limits are admitted. Work that
        alone exceeds a limit is admitted only when nothing waits and nothing
        is reserved, so it is never refused forever.

        Args:
            num_requests: engine requests about to be sent (prompts x ``n``).
            num_tokens: their prompt tokens in total.
        Returns:
            The :class:`Reservation` of their room.
        Raises:
            EngineOverloadedError: a limit would be exceeded (nothing is reserved).
            ValueError: a negative count.
        """
        if num_requests < 0 or num_tokens < 0:
            raise ValueError(f"counts must be >= 0, got {num_requests} requests, "
                             f"{num_tokens} tokens")  # fmt: skip
        queued = len(self.waiting) + self.reserved_requests
        cap = self.max_waiting_requests
        if cap is not None and queued + num_requests > cap and queued > 0:
            raise EngineOverloadedError(
                f"server is overloaded: {queued} requests are waiting "
                f"(--max-waiting-requests {cap}); retry later"
            )
        tokens = self.waiting_tokens + self.reserved_tokens
        cap = self.max_waiting_tokens
        if cap is not None and tokens + num_tokens > cap and queued > 0:
            raise EngineOverloadedError(
                f"server is overloaded: {tokens} prompt tokens are waiting "
                f"(--max-waiting-tokens {cap}); retry later"
            )
        return Reservation(self, num_requests, num_tokens)

    def unreserve(self, num_requests: int, num_tokens: int) -> None:
        """Take reserved room off the counts (a :class:`Reservation` calls this)."""
        self.reserved_requests = max(0, self.reserved_requests - num_requests)
        self.reserved_tokens = max(0, self.reserved_tokens - num_tokens)

    def start_waiting(self, request_id: str, num_tokens: int,
                      reservation: Reservation | None) -> None:  # fmt: skip
        """Count a request just sent as waiting; its share of ``reservation``
        (when given) goes back in the same step, so it is counted once.

        Args:
            request_id: the engine request id.
            num_tokens: its prompt tokens.
            reservation: what it was admitted under, or ``None``.
        """
        self.waiting[request_id] = num_tokens
        self.waiting_tokens += num_tokens
        if reservation is not None:
            reservation.take(num_tokens)

    def stop_waiting(self, request_id: str) -> None:
        """The request's first output arrived, or it ended: it no longer waits.
        Unknown ids are ignored."""
        tokens = self.waiting.pop(request_id, None)
        if tokens is not None:
            self.waiting_tokens -= tokens

    def is_waiting(self, request_id: str) -> bool:
        """True while ``request_id`` waits for its first output."""
        return request_id in self.waiting


class AdmissionCounts:
    """The waiting and reserved counts an engine client reports, read from
    its :class:`Admission` (``self.admission``; one per server, shared by the
    engines of a data-parallel client)."""

    admission: Admission

    @property
    def num_waiting(self) -> int:
        """Requests sent to an engine that have not had their first output yet."""
        return len(self.admission.waiting)

    @property
    def num_waiting_tokens(self) -> int:
        """Prompt tokens of the waiting requests."""
        return self.admission.waiting_tokens

    @property
    def num_reserved(self) -> int:
        """Requests admitted and not sent yet (nor released)."""
        return self.admission.reserved_requests

    @property
    def num_reserved_tokens(self) -> int:
        """Prompt tokens of the reserved requests."""
        return self.admission.reserved_tokens
