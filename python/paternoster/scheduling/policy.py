"""The policy half of the scheduler contract (docs/schedulers.md, contract
version :data:`SCHEDULER_API_VERSION`): the class attributes a policy sets and
the hooks it overrides, with their defaults. A policy subclasses
:class:`~paternoster.scheduling.scheduler.Scheduler`, which derives from
:class:`SchedulerPolicy` and owns the bookkeeping the defaults use
(``waiting``, :meth:`~paternoster.scheduling.scheduler.Scheduler.admit`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.request_queue import FCFSRequestQueue, RequestQueue

#: Version of the plugin contract (docs/schedulers.md) this base class implements.
#: Anything on that page that could break a plugin bumps it; the registry refuses a
#: policy class whose ``api_version`` differs.
SCHEDULER_API_VERSION = 2


def option_text(value: Any) -> str:
    """``value`` as a ``--scheduler-config`` user wrote it, for error messages:
    JSON (``true``, ``null``, ``"often"``) where it is JSON, else ``repr``."""
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return repr(value)


#: The largest integer option: options travel to the engine in msgpack (int64).
MAX_INT_OPTION = 2**63 - 1


def require_int(options: Mapping[str, Any], name: str, minimum: int = 0) -> int:
    """``options[name]`` when it is an integer in ``[minimum, 2**63 - 1]``
    (``True`` is not).

    Raises:
        ValueError: ``"<name> must be an integer in [<minimum>, 2**63 - 1], got <value as JSON>"``.
    """
    value = options[name]
    if isinstance(value, bool) or not isinstance(value, int) \
            or not minimum <= value <= MAX_INT_OPTION:  # fmt: skip
        raise ValueError(f"{name} must be an integer in [{minimum}, 2**63 - 1], "
                         f"got {option_text(value)}")
    return value


class SchedulerPolicy:
    """The hooks of a scheduling policy and the attributes it sets, with the
    defaults of the base :class:`~paternoster.scheduling.scheduler.Scheduler`.

    A policy overrides the hooks (``create_waiting_queue``,
    ``enqueue_waiting``, ``requeue_preempted``, ``order_running``,
    ``num_tokens_to_schedule``, ``can_admit``, ``select_victim``,
    ``schedule_waiting``, ``on_admitted``, ``on_finished``, ``on_step_time``)
    and may call the Scheduler's building blocks (``fits``, ``can_allocate``,
    ``allocate``, ``admit``, ``preempt``); it never edits ``running`` or
    ``waiting`` behind them.
    """

    #: The name the policy is registered and selected under (``--scheduler NAME``);
    #: used in messages.
    name: ClassVar[str] = "scheduler"
    #: Version of the plugin contract this class implements (docs/schedulers.md).
    api_version: ClassVar[int] = SCHEDULER_API_VERSION
    #: Whether the policy may split a prompt across steps. Policies that keep
    #: prompts whole need a token budget of at least ``max_model_len``.
    supports_chunked_prefill: ClassVar[bool] = False
    #: The policy's options (``--scheduler-config`` keys) and their defaults.
    default_options: ClassVar[dict[str, Any]] = {}

    @classmethod
    def check_option_keys(cls, policy_config: Mapping[str, Any]) -> None:
        """Refuse ``--scheduler-config`` keys the policy does not have (checked
        by ``serve``/``LLM`` before the engine starts, and by the base
        ``__init__``); the values are the policy's own to check.

        Raises:
            ValueError: naming the unknown keys and the accepted ones.
        """
        unknown = set(policy_config) - set(cls.default_options)
        if unknown:
            raise ValueError(
                f"unknown scheduler_config keys for {cls.name!r}: {sorted(unknown)}; "
                f"accepted: {sorted(cls.default_options) or 'none'}"
            )

    @classmethod
    def check_options(cls, policy_config: Mapping[str, Any]) -> None:
        """Check ``--scheduler-config`` before the engine starts: unknown keys
        (:meth:`check_option_keys`), then the values with the defaults filled
        in (:meth:`check_option_values`). ``serve`` and ``LLM`` call it when
        they build the config, so a bad value fails before the model loads;
        the base ``__init__`` calls it again.

        Raises:
            ValueError: naming the unknown keys, or the option with a bad value.
        """
        cls.check_option_keys(policy_config)
        cls.check_option_values({**cls.default_options, **policy_config})

    @classmethod
    def check_option_values(cls, options: Mapping[str, Any]) -> None:
        """Refuse bad option values; ``options`` holds every key of
        ``default_options`` (the user's values over the defaults). A policy
        with options overrides it (and calls ``super()`` when it extends
        another policy's options); the base accepts anything.

        Raises:
            ValueError: naming the option and the value it got.
        """

    def create_waiting_queue(self) -> RequestQueue:
        """The queue ``waiting`` is; called once, at the end of the base ``__init__``'s
        bookkeeping (options are parsed by then). Default: :class:`FCFSRequestQueue`."""
        return FCFSRequestQueue()

    def enqueue_waiting(self, request: Request) -> None:
        """Put a new request into ``waiting`` (default: ``add_request``, the back
        of a FIFO)."""
        self.waiting.add_request(request)

    def requeue_preempted(self, request: Request) -> None:
        """Put a preempted request back into ``waiting`` (default:
        ``prepend_request``, the front of a FIFO)."""
        self.waiting.prepend_request(request)

    def order_running(self, running: list[Request]) -> list[Request]:
        """Order in which running requests get this step's budget.

        Args:
            running: a copy of ``running`` (admission order).
        Returns:
            The same requests, reordered. Default: unchanged.
        """
        return running

    def num_tokens_to_schedule(self, request: Request, token_budget: int) -> int:
        """How many of ``request``'s uncomputed tokens to compute this step.

        Args:
            request: a running or waiting request.
            token_budget: tokens still free in this step (>= 1).
        Returns:
            A count in ``[0, request.num_tokens - request.num_computed_tokens]``
            and ``<= token_budget``; 0 means "not this step". The default keeps
            prompts whole: all remaining tokens if they fit the budget, else 0.
        """
        remaining = request.num_tokens - request.num_computed_tokens
        return remaining if remaining <= token_budget else 0

    def can_admit(self, request: Request) -> bool:
        """Whether ``request`` may be admitted now; :meth:`admit` asks first,
        before the prefix-cache lookup and the KV allocation. Default: True."""
        return True

    def select_victim(self, running: Sequence[Request]) -> Request:
        """Choose the running request to preempt when KV blocks run out.

        Args:
            running: every running request, in admission order (non-empty),
                the one that needs blocks included (choosing it preempts it).
        Returns:
            One of ``running``. The default takes the most recently admitted
            (vLLM v1's FCFS victim).
        """
        return running[-1]

    def on_admitted(self, request: Request) -> None:
        """Called when ``request`` moves from ``waiting`` to ``running``."""

    def on_finished(self, request: Request) -> None:
        """Called when ``request`` finishes (any reason, abort included)."""

    def on_step_time(self, out: SchedulerOutput, seconds: float) -> None:
        """Called after each step that ran, with its plan and its period as a
        decode sees it, on :attr:`clock` (measured in the server, the cost
        model's time in the simulator): from the previous step's end when the
        engine stepped back to back (its loop's work between steps included),
        else from this step's start, to this step's end. Called after
        :meth:`update_from_output` (``num_computed_tokens`` has advanced;
        ``out.batch_arrays()`` holds the plan as of planning). Default: nothing."""

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit waiting requests after the running ones got their tokens.

        Called by :meth:`schedule` unless a running request was preempted this
        step. The default admits the head of ``waiting`` with :meth:`admit`
        while budget is left, and stops at the first that is not admitted (no
        overtaking).

        Args:
            out: this step's plan so far (admissions are added to it).
            budget: tokens still free in this step.
        Returns:
            The budget left.
        """
        while self.waiting and budget > 0:
            num_new = self.admit(self.waiting.peek_request(), out, budget)
            if num_new == 0:
                break
            budget -= num_new
        return budget
