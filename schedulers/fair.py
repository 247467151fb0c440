"""Fair sharing between tenants: the Virtual Token Counter (VTC) policy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from paternoster.request import Request
from paternoster.schedulers.chunked_prefill import ChunkedPrefillScheduler
from paternoster.scheduling.fair_queue import Tenant, TenantFairQueue
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.policy import option_text
from paternoster.scheduling.request_queue import RequestQueue


class FairScheduler(ChunkedPrefillScheduler):
    """Share the engine between tenants by the service each received.

    The Virtual Token Counter of Sheng et al., "Fairness in Serving Large
    Language Models" (OSDI'24, arXiv:2401.00588, Algorithm 1), on this
    engine's chunked-prefill step:

    - Each tenant (``Request.tenant``: the OpenAI ``user`` field or the
      ``X-Tenant-Id`` header; ``None`` is one anonymous tenant) has a counter
      of the service it received, the paper's cost ``h = w_p * n_p + w_q * n_q``:
      every prefill token computed (prompt chunks, and recomputation after a
      preemption) adds ``w_p`` (``input_token_weight``), every decode token
      ``w_q`` (``output_token_weight``), divided by the tenant's weight. A
      step is charged when it is planned, so the admissions within one step
      already see each other. Tokens found in the prefix cache cost nothing.
    - Admission takes the waiting head of the backlogged tenant (one with a
      waiting request) whose counter is the smallest (:class:`TenantFairQueue`),
      and stops at the first that is not admitted, as VTC does (skipping it
      would let the others' small requests take the room it waits for).
    - Counter lift: a tenant that becomes backlogged is raised to the smallest
      counter among the backlogged ones (to the last one's when none is), so
      idle time banks no credit.
    - Running decodes always run first; unfinished prompt chunks follow, the
      smallest counter first. Prompts are split across steps (chunked
      prefill, ``long_prefill_token_threshold`` as in ``chunked_prefill``);
      a request is admitted only when its whole prompt :meth:`fits`.
    - The preemption victim is the most recently admitted request of the
      running tenant with the largest counter.

    Guarantee (the paper's service-difference theorem; its lower bound shows
    the factor 2 is tight for a work-conserving scheduler): for two tenants ``f``
    and ``g`` backlogged throughout ``[t1, t2)``,
    ``|W_f(t1, t2) - W_g(t1, t2)| <= 2 * U``, ``U = max(w_p * L_input, w_q * M)``,
    where ``W`` is the service above, ``L_input`` the longest prompt and ``M``
    the most tokens a running batch can hold (here the KV cache,
    ``num_kv_blocks * block_size``). The proof assumes the paper's setting
    (memory reserved for the whole output at admission, no preemption); this
    engine admits optimistically and preempts by recompute, so the bound is
    checked on simulated traces (tests/simulate/test_fair_bound.py), not
    proven here. With ``tenant_weights`` the counters count service divided
    by weight (the paper's weighted VTC), so a weight-2 tenant gets about
    twice the service of a weight-1 one while both are backlogged.

    Options (``--scheduler-config``):
        input_token_weight: ``w_p``, cost of one prefill token (default 1).
        output_token_weight: ``w_q``, cost of one decode token (default 2, the
            paper's choice: a decode token costs about twice a prompt token).
        tenant_weights: ``{"tenant": weight}``, shares of named tenants
            (weight in [0.001, 1000]; others 1).
        long_prefill_token_threshold: as in ``chunked_prefill`` (0: no cap).
    Raises:
        ValueError: a token weight outside [0, 1000] or not a number, both
            token weights 0, a ``tenant_weights`` that is not a map of names to
            numbers in [0.001, 1000], or a bad ``long_prefill_token_threshold``.
    """

    name = "fair"
    default_options: ClassVar[dict[str, Any]] = {
        "input_token_weight": 1.0,
        "output_token_weight": 2.0,
        "tenant_weights": {},
        "long_prefill_token_threshold": 0,
    }

    @classmethod
    def check_option_values(cls, options: Mapping[str, Any]) -> None:
        """The weights (numbers >= 0, not both 0), ``tenant_weights`` (tenant
        -> number > 0) and ``chunked_prefill``'s option.

        Raises:
            ValueError: naming the option.
        """
        super().check_option_values(options)
        w_in = _weight(options["input_token_weight"], "input_token_weight")
        w_out = _weight(options["output_token_weight"], "output_token_weight")
        if w_in == 0 and w_out == 0:
            raise ValueError("input_token_weight and output_token_weight must not both be 0")
        _tenant_weights(options["tenant_weights"])

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # checks the options
        self.input_token_weight = _weight(self.options["input_token_weight"], "input_token_weight")
        self.output_token_weight = _weight(
            self.options["output_token_weight"], "output_token_weight"
        )
        self.tenant_weights = _tenant_weights(self.options["tenant_weights"])
        self._live: dict[Tenant, int] = {}  # tenant -> its live requests
        self._charged: set[str] = set()  # request ids charged in this step's plan
        self._next_sweep = _SWEEP_MIN

    # ------------------------------------------------------------- counters

    def create_waiting_queue(self) -> RequestQueue:
        """Per-tenant FIFOs ordered by virtual token counter."""
        self.fair_queue = TenantFairQueue()
        return self.fair_queue

    def counter(self, tenant: Tenant) -> float:
        """``tenant``'s virtual token counter (service received / its weight)."""
        return self.fair_queue.counter(tenant)

    def service(self, request: Request, num_tokens: int) -> float:
        """The charge for computing ``num_tokens`` more tokens of ``request``
        (planned, not yet computed): ``w_q`` for a decode token (one token
        after the whole prompt), ``w_p`` per token otherwise, divided by the
        tenant's weight."""
        if num_tokens == 1 and request.num_computed_tokens >= request.num_prompt_tokens:
            cost = self.output_token_weight
        else:
            cost = self.input_token_weight * num_tokens
        return cost / self.tenant_weights.get(request.tenant, 1.0)

    def _charge(self, request: Request, num_tokens: int) -> None:
        """Charge ``request``'s tenant for this step's ``num_tokens`` (once per step)."""
        self._charged.add(request.request_id)
        self.fair_queue.charge(request.tenant, self.service(request, num_tokens))

    def _charge_plan(self, out: SchedulerOutput) -> None:
        """Charge every row of ``out`` not charged yet in this step."""
        for request, num_new in zip(out.scheduled, out.num_scheduled_tokens):
            if request.request_id not in self._charged:
                self._charge(request, num_new)

    # ----------------------------------------------------------------- hooks

    def enqueue_waiting(self, request: Request) -> None:
        """Count the tenant's live request and queue it in its tenant's FIFO."""
        self._live[request.tenant] = self._live.get(request.tenant, 0) + 1
        self.waiting.add_request(request)

    def order_running(self, running: list[Request]) -> list[Request]:
        """Decodes first (admission order), then unfinished prompts, the
        smallest tenant counter first (ties in admission order)."""

        def key(r: Request) -> tuple[int, float]:
            if r.num_tokens - r.num_computed_tokens == 1:
                return (0, 0.0)
            return (1, self.counter(r.tenant))

        return sorted(running, key=key)

    def select_victim(self, running: Sequence[Request]) -> Request:
        """The most recently admitted request of the running tenant with the
        largest counter."""
        return max(reversed(running), key=lambda r: self.counter(r.tenant))

    def on_finished(self, request: Request) -> None:
        """Forget the counters of tenants gone idle once they are at or below
        the lift floor (nothing is lost: they would be lifted to it)."""
        tenant = request.tenant
        left = self._live.get(tenant, 1) - 1
        if left > 0:
            self._live[tenant] = left
            return
        self._live.pop(tenant, None)
        self.fair_queue.forget(tenant)
        counters = self.fair_queue.counters
        if len(counters) > self._next_sweep:  # idle tenants above the floor
            for t in [t for t in counters if t not in self._live]:
                self.fair_queue.forget(t)
            self._next_sweep = max(_SWEEP_MIN, 2 * len(counters))

    # -------------------------------------------------------------- the step

    def schedule(self) -> SchedulerOutput:
        """The base step, with every planned row charged to its tenant."""
        self._charged.clear()
        out = super().schedule()
        self._charge_plan(out)  # a step that preempted skipped schedule_waiting
        return out

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Charge the running rows, then admit the head of the backlogged
        tenant with the smallest counter while it is admitted, charging each
        admission at once (so the next pick sees it).

        Returns:
            The budget left.
        """
        self._charge_plan(out)
        while self.waiting and budget > 0:
            head = self.waiting.peek_request()
            num_new = self.admit(head, out, budget)
            if num_new == 0:
                break
            self._charge(head, num_new)
            budget -= num_new
        return budget


_SWEEP_MIN = 1024  # counters kept before idle tenants above the floor are swept


#: Bounds of a tenant's weight: shares further apart than a million to one
#: mean nothing to a scheduler, and a weight near 0 (1e-310) would overflow
#: its counter (service / weight) to infinity, which switches fairness off.
TENANT_WEIGHT_RANGE = (1e-3, 1e3)
#: Largest token weight (the paper's are 1 and 2), so counters stay exact sums.
MAX_TOKEN_WEIGHT = 1e3


def _weight(value: object, name: str) -> float:
    """A token weight: a number in [0, ``MAX_TOKEN_WEIGHT``].

    Raises:
        ValueError: naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number >= 0, got {option_text(value)}")
    try:
        ok = 0 <= value <= MAX_TOKEN_WEIGHT  # False for nan
    except OverflowError:  # an integer past float's range
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a number in [0, {MAX_TOKEN_WEIGHT:g}], "
                         f"got {option_text(value)}")  # fmt: skip
    return float(value)


def _tenant_weights(value: object) -> dict[str, float]:
    """``tenant_weights``: a map of tenant names to numbers in
    ``TENANT_WEIGHT_RANGE``.

    Raises:
        ValueError: naming ``tenant_weights`` and the bad entry.
    """
    if not isinstance(value, dict):
        raise ValueError(f"tenant_weights must be a map of tenant to weight, "
                         f"got {option_text(value)}")
    out = {}
    for tenant, w in value.items():
        if not isinstance(tenant, str) or not tenant:
            raise ValueError(f"tenant_weights keys must be tenant names, got {option_text(tenant)}")
        name = f"tenant_weights[{option_text(tenant)}]"  # the JSON path
        lo, hi = TENANT_WEIGHT_RANGE
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not lo <= w <= hi:
            raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {option_text(w)}")
        out[tenant] = float(w)
    return out
