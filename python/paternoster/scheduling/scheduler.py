"""The Scheduler base class: queues, KV allocation, preemption and stop checks.

A policy (a subclass registered under the entry-point group
``paternoster.schedulers``) decides order, admission and victims through the
public hooks documented in docs/schedulers.md (contract version
:data:`SCHEDULER_API_VERSION`); the base class owns the bookkeeping. The loop
follows iteration-level scheduling (Orca, Yu et al., OSDI'22) with one token
budget per step for prefill and decode alike (vLLM v1): every request has
``num_computed_tokens`` chasing ``num_tokens``, and a step hands out up to
``max_num_batched_tokens`` tokens to at most ``max_num_seqs`` requests.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from paternoster.config import SchedulerConfig
from paternoster.engine.messages import EngineCoreOutput
from paternoster.request import Request, RequestStatus
from paternoster.scheduling.output import SchedulerOutput

# The contract version lives with the hooks; re-exported (the registry and plugins read it here).
from paternoster.scheduling.policy import SCHEDULER_API_VERSION as SCHEDULER_API_VERSION
from paternoster.scheduling.policy import SchedulerPolicy
from paternoster.scheduling.prefix_cache import (
    cache_computed_blocks,
    lookup_prefix,
    peek_prefix,
    undo_lookup,
)
from paternoster.scheduling.request_queue import RequestQueue
from paternoster.scheduling.stop import check_stop


class Scheduler(SchedulerPolicy):
    """Base class of scheduling policies.

    The base class keeps the queues (``waiting``, a :class:`RequestQueue`;
    ``running``, a list in admission order), allocates KV slots through the
    C++ ``KVCacheManager`` (all or nothing), preempts by recompute when blocks
    run out, appends sampled tokens, checks stop conditions (EOS, stop token
    ids, ``max_tokens``, ``max_model_len``) and frees finished requests'
    blocks. A policy overrides the hooks (``create_waiting_queue``,
    ``enqueue_waiting``, ``requeue_preempted``, ``order_running``,
    ``num_tokens_to_schedule``, ``can_admit``, ``select_victim``,
    ``schedule_waiting``, ``on_admitted``, ``on_finished``; their defaults are
    :class:`~paternoster.scheduling.policy.SchedulerPolicy`'s) and may call the
    building blocks (``fits``, ``can_allocate``, ``allocate``, ``admit``,
    ``preempt``); it never edits ``running`` or ``waiting`` behind them.

    Automatic prefix caching (when the KV cache manager has it enabled, after
    vLLM's): on admission a request's longest cached prefix, in whole blocks,
    counts as computed (``num_computed_tokens`` starts past it, so a preempted
    request re-hits its own blocks), and after every step the blocks the step
    filled are registered for later requests. Requests asking for prompt
    logprobs skip the lookup (their prompt must be scored).

    Args:
        config: per-step limits and the policy's own options.
        kv_cache_manager: ``paternoster._core.KVCacheManager`` (or anything with
            ``allocate_slots(id, num_tokens, num_computed_tokens) -> bool``,
            ``can_allocate`` and ``num_required_blocks`` of the same arguments
            (sliding-window KV cache groups release what the computed count
            puts out of reach), ``num_free_blocks`` and ``free(id)``;
            prefix caching is used when it has ``enable_caching()`` returning
            True).
        batch_builder: ``paternoster._core.BatchBuilder`` holding each
            request's token ids (``add_request``, ``append_tokens``,
            ``remove_request``).
        max_model_len: context length in tokens (prompt + output).
    Raises:
        ValueError: a policy that keeps prompts whole with
            ``max_num_batched_tokens < max_model_len``, or unknown
            ``policy_config`` keys.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager,
        batch_builder,
        max_model_len: int,
    ) -> None:
        if not self.supports_chunked_prefill and config.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) must be >= "
                f"max_model_len ({max_model_len}) for a scheduler that keeps prompts whole"
            )
        self.check_options(config.policy_config)
        self.options: dict[str, Any] = {**self.default_options, **config.policy_config}
        self.config = config
        self.num_steps = 0
        self.kv_cache_manager = kv_cache_manager
        enable_caching = getattr(kv_cache_manager, "enable_caching", None)
        #: Whether admission looks up cached prefixes (the KV cache manager's setting).
        self.prefix_caching: bool = bool(enable_caching()) if callable(enable_caching) else False
        self.batch_builder = batch_builder
        self.max_model_len = max_model_len
        self.waiting: RequestQueue = self.create_waiting_queue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions_total = 0
        #: The engine's clock (seconds; the simulator's virtual clock in
        #: ``paternoster simulate``), the one ``Request.arrival_time`` is on.
        #: The engine sets it after construction.
        self.clock: Callable[[], float] = time.monotonic
        self._ids = itertools.count()

    # ----------------------------------------------------------------- queues

    def add_request(self, request: Request) -> None:
        """Queue a new request (through :meth:`enqueue_waiting`).

        Raises:
            ValueError: a live request already has this ``request_id``.
        """
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        request.internal_id = next(self._ids)
        request.status = RequestStatus.WAITING
        self.batch_builder.add_request(request.internal_id, request.prompt_token_ids)
        self.requests[request.request_id] = request
        self.enqueue_waiting(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        """Abort live requests; unknown or finished ids are ignored.

        Returns:
            The aborted requests (status ``FINISHED_ABORTED``; blocks freed).
        """
        aborted = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove_request(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED)
            aborted.append(request)
        return aborted

    @property
    def num_running(self) -> int:
        """Requests holding a sequence slot (admitted, not finished or preempted)."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests in ``waiting`` (new and preempted)."""
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.requests)

    # ------------------------------------------------- building blocks to call

    def fits(self, request: Request) -> bool:
        """Whether ``request`` could be admitted whole now: a sequence slot is
        free, and the free KV blocks cover all its tokens on top of the blocks
        running requests still need to finish their prompts.

        Reserving those blocks keeps admission from thrashing: allocating only
        a first chunk would admit requests that are preempted again and again
        as their prompts grow. Before admission ``request`` has no blocks (and
        no prefix-cache hit yet), so this is an upper bound on what it needs.
        """
        if len(self.running) >= self.config.max_num_seqs:
            return False
        kv = self.kv_cache_manager
        reserved = sum(
            self._blocks_to_finish_prompt(r) for r in self.running
            if r.num_tokens - r.num_computed_tokens > 1
        )
        needed = self._blocks_to_finish_prompt(request)
        return needed + reserved <= kv.num_free_blocks()

    def _blocks_to_finish_prompt(self, request: Request) -> int:
        """Most blocks ``request`` adds before its prompt is done: with
        sliding-window KV cache groups, the need of its last step (at most
        the token budget from its end), which bounds every earlier step's
        (windows release blocks as chunks advance; full groups only grow)."""
        last_start = max(request.num_computed_tokens,
                         request.num_tokens - self.config.max_num_batched_tokens)
        return self.kv_cache_manager.num_required_blocks(
            request.internal_id, request.num_tokens, last_start)

    def num_cached_prefix_tokens(self, request: Request) -> int:
        """Prompt tokens of a waiting ``request`` that admission would find in
        the prefix cache now (whole blocks, never the last token; 0 with
        prefix caching off), found without taking the blocks, which may be
        evicted before it is admitted: for planning, e.g. how long its
        prefill will take."""
        if not self.prefix_caching or request.num_computed_tokens > 0:
            return 0
        return peek_prefix(self.kv_cache_manager, self.batch_builder, request)

    def can_allocate(self, request: Request, num_new: int) -> bool:
        """Whether the KV blocks for ``num_new`` more computed tokens of
        ``request`` are free (changes nothing)."""
        return self.kv_cache_manager.can_allocate(
            request.internal_id, request.num_computed_tokens + num_new,
            request.num_computed_tokens,
        )

    def allocate(self, request: Request, num_new: int) -> bool:
        """Allocate the KV slots for ``num_new`` more computed tokens of
        ``request``, all or nothing.

        Returns:
            Whether they were allocated (on False nothing changed).
        """
        return self.kv_cache_manager.allocate_slots(
            request.internal_id, request.num_computed_tokens + num_new,
            request.num_computed_tokens,
        )

    def admit(self, request: Request, out: SchedulerOutput, budget: int) -> int:
        """Move a waiting request to ``running`` with this step's first tokens.

        In order: a free sequence slot, :meth:`can_admit`, the prefix-cache
        lookup, :meth:`num_tokens_to_schedule`, :meth:`allocate`. When one of
        them says no, nothing changes (hit blocks are given back).

        Args:
            request: a request in ``waiting`` (usually its head).
            out: this step's plan; the admitted request is added to it.
            budget: tokens still free in this step.
        Returns:
            The tokens scheduled for it (0: not admitted).
        Raises:
            ValueError: ``request`` is not waiting.
        """
        if request not in self.waiting:
            raise ValueError(f"cannot admit {request.request_id!r}: it is not waiting")
        if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return 0
        if not self.can_admit(request):
            return 0
        if self.prefix_caching:
            lookup_prefix(self.kv_cache_manager, self.batch_builder, request)
        num_new = self.num_tokens_to_schedule(request, budget)
        if num_new <= 0 or not self.allocate(request, num_new):
            if self.prefix_caching:  # give back the hit blocks
                undo_lookup(self.kv_cache_manager, request)
            return 0
        self.waiting.remove_request(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.on_admitted(request)
        out.add(request, num_new)
        return num_new

    def preempt(self, request: Request, out: SchedulerOutput) -> int:
        """Preempt a running request by recompute.

        Takes it out of ``running`` and out of this step's plan, frees its
        blocks, keeps every token (they are recomputed with the prompt),
        counts the preemption, records it in ``out.preempted`` and hands it to
        :meth:`requeue_preempted`.

        Args:
            request: a running request.
            out: this step's plan.
        Returns:
            The tokens it had been scheduled this step (given back to the budget).
        Raises:
            ValueError: ``request`` is not running.
        """
        if request.status != RequestStatus.RUNNING:
            raise ValueError(
                f"cannot preempt {request.request_id!r}: it is {request.status.name}, not RUNNING"
            )
        self.running.remove(request)
        freed = out.remove(request)
        self.kv_cache_manager.free(request.internal_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        out.preempted.append(request)
        self.requeue_preempted(request)
        return freed

    def reject(self, request: Request, out: SchedulerOutput, reason: str) -> None:
        """Finish a waiting request with an error instead of running it (load
        shedding): it leaves ``waiting`` with status ``FINISHED_ERROR``, is
        listed in ``out.rejected`` and the engine ends it with an "overloaded"
        error (HTTP 503).

        Raises:
            ValueError: ``request`` is not waiting.
        """
        if request not in self.waiting:
            raise ValueError(f"cannot reject {request.request_id!r}: it is not waiting")
        self.waiting.remove_request(request)
        self._finish(request, RequestStatus.FINISHED_ERROR)
        out.rejected.append((request, reason))

    # -------------------------------------------------------------- the step

    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then admissions from waiting.

        Returns:
            The plan (see :class:`SchedulerOutput`).
        """
        self.num_steps += 1
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self.schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Give running requests their tokens in :meth:`order_running` order,
        preempting :meth:`select_victim`'s choices while blocks run out;
        returns the budget left."""
        running_status = RequestStatus.RUNNING
        for request in self.order_running(list(self.running)):
            if budget <= 0:
                break
            if request.status != running_status:
                continue  # preempted earlier in this loop
            num_new = self.num_tokens_to_schedule(request, budget)
            if num_new <= 0:
                continue
            while not self.allocate(request, num_new):
                victim = self.select_victim(self.running)
                budget += self.preempt(victim, out)
                if victim is request:
                    break
            else:
                out.add(request, num_new)
                budget -= num_new
        return budget

    # ------------------------------------------------------------ the update

    def update_from_output(
        self, out: SchedulerOutput, sampled: dict[int, int]
    ) -> list[EngineCoreOutput]:
        """Advance progress, append sampled tokens, check stops, free finished.

        Args:
            out: the plan this step ran.
            sampled: ``{row index in out.scheduled: sampled token id}`` for the
                rows whose prefill completed this step (the others computed a
                prompt chunk and sample nothing).
        Returns:
            One output per request that got a token this step.
        """
        outputs: list[EngineCoreOutput] = []
        grown_ids: list[int] = []
        grown_tokens: list[int] = []
        if self.prefix_caching and out.scheduled:
            cache_computed_blocks(self.kv_cache_manager, self.batch_builder, out)
        for request, num_new in zip(out.scheduled, out.num_scheduled_tokens):
            request.num_computed_tokens += num_new
        for row, request in enumerate(out.scheduled):
            token = sampled.get(row)
            if token is None:
                continue
            request.output_token_ids.append(token)
            status = check_stop(request, token, self.max_model_len)
            if status is None:
                grown_ids.append(request.internal_id)
                grown_tokens.append(token)
                outputs.append(
                    EngineCoreOutput(
                        request.request_id, [token], None, None, None, request.num_prompt_tokens
                    )
                )
            else:
                self.running.remove(request)
                self._finish(request, status)
                outputs.append(self._make_output(request, [token]))
        if grown_ids:
            self.batch_builder.append_tokens(
                np.asarray(grown_ids, dtype=np.int64), np.asarray(grown_tokens, dtype=np.int64)
            )
        return outputs

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        self.kv_cache_manager.free(request.internal_id)
        self.batch_builder.remove_request(request.internal_id)
        del self.requests[request.request_id]
        self.on_finished(request)

    @staticmethod
    def _make_output(request: Request, new_token_ids: list[int]) -> EngineCoreOutput:
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason if request.is_finished else None,
            num_prompt_tokens=request.num_prompt_tokens,
        )
