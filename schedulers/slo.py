"""SLO-aware scheduling: per-step token budgets from a step-time model, prompt
chunks by deadline slack, and a rule for requests that can no longer make it."""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from paternoster.request import Request, RequestStatus
from paternoster.schedulers.slo_options import DEFAULT_OPTIONS, SLOOptions, log_plan_basis
from paternoster.scheduling.cost_model import StepWork
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.scheduler import Scheduler
from paternoster.scheduling.step_time import StepTimePredictor

_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
logger = logging.getLogger(__name__)
#: Steps between two debug log lines of the policy's state.
LOG_EVERY = 500
#: Decode gaps the ITL miss budget is counted over (exponentially weighted):
#: about two minutes at 30 decodes and 5-6 steps a second, the span a p95 ITL
#: objective is usually judged over. A short window (it was 2000, ~12 s) spends
#: the budget evenly and leaves it unused in a burst, when rescues are needed.
MISS_WINDOW = 20000
#: Prefill candidates ordered per step by deadline; later ones count as late
#: (bounds the per-step cost under overload).
MAX_CANDIDATES = 256


class SLOScheduler(Scheduler):
    """Keep running decodes within their ITL target, give the rest of each step
    to prompt chunks in deadline order, and handle late requests by rule.

    Every request has a TTFT and an ITL target (its own ``slo_ttft_s`` /
    ``slo_itl_s``, else its ``priority`` class's in ``classes``, else
    ``ttft_s`` / ``itl_s``); its TTFT deadline is arrival + TTFT target.
    Each step:

    1. **Step-time target.** Every decoding request gets its token, and a
       decode gap is one step, so a step must not outlast the tightest ITL
       target among them: ``T = min ITL target * (1 - margin) / spread``
       (``spread``: the model's recent 95th percentile of measured /
       predicted, so unpredictable noise does not push steps over). With
       nothing decoding, ``T`` is the time of a full
       ``max_num_batched_tokens`` step.
    2. **Budget.** A step-time model predicts the step (``overhead +
       a_prefill * P + a_decode * D + a_kv * K_decode + a_kv_prefill *
       K_prefill``: the simulator's calibrated cost model, corrected online
       from measured steps by :class:`StepTimePredictor`); what the decodes
       leave of ``T`` goes to prompt chunks, each as large as the time left
       allows (a quadratic in the chunk size: its attention to the cached
       prefix). When the decodes alone use up ``T``, ``min_chunk_tokens``
       are still prefilled so the queue moves. This is Sarathi-Serve's
       stall-free batching (Agrawal et al., OSDI'24) with the token budget
       chosen per step from the latency target instead of fixed.
    3. **Order.** Prompt chunks (running prefills and waiting requests
       together) go in earliest-deadline order, thinned by Moore-Hodgson
       (Moore, Management Science 1968): walking the deadlines, whenever the
       predicted end of the prefills so far misses the current deadline, the
       one with the most prefill work moves to the *late* group, which
       maximises the requests that meet their TTFT deadline under the model
       (the goodput view of DistServe, Zhong et al., OSDI'24, and
       SLOs-Serve, Chen et al. 2025). Late requests run after the others,
       earliest deadline first, with the time they leave (deprioritised,
       never dropped). A preempted request that has already streamed tokens
       goes first.
    4. **Rescue.** When the first late request that could still make its
       deadline would, in one longer step holding the whole prompts of the
       requests ahead of it and its own, that step runs, provided the decode
       gaps it pushes over their ITL target keep the recent share of such
       gaps (measured, so steps that overran by noise count too; the last
       ~``MISS_WINDOW`` gaps, exponentially weighted) within
       ``itl_miss_budget`` (default 4 %, under the 5 % a p95 ITL objective
       allows; 0 keeps every step within ``T``).
    5. **Load shedding** (``load_shedding: true``): a waiting request that
       has produced nothing and cannot meet its deadline even if its whole
       prompt (less what the prefix cache holds now) ran in this step is
       refused (HTTP 503, OpenAI error shape) instead of run late.

    Admission needs the whole prompt to :meth:`fits` (as ``chunked_prefill``);
    the first on-time request that does not fit stops admission. When KV
    blocks run out, the victim is the running prefill with the latest
    deadline, else the most recently admitted request.

    Options (``--scheduler-config``): ``ttft_s`` (2.0), ``itl_s`` (0.2),
    ``classes`` (``{}``; e.g. ``{"0": {"ttft_s": 0.5, "itl_s": 0.1}}``),
    ``load_shedding`` (false), ``margin`` (0.05), ``itl_miss_budget`` (0.04),
    ``min_chunk_tokens`` (16), ``cost_model`` (null: the calibrated default;
    a JSON path or an object), ``adapt`` (true). See docs/schedulers.md
    ("slo").
    Raises:
        ValueError: a bad option (the message names it).
    """

    name = "slo"
    supports_chunked_prefill = True
    default_options: ClassVar[dict[str, Any]] = DEFAULT_OPTIONS

    @classmethod
    def check_option_values(cls, options: Mapping[str, Any]) -> None:
        """Every option as :meth:`SLOOptions.parse` reads it (a ``cost_model``
        file is read).

        Raises:
            ValueError: naming the option.
        """
        SLOOptions.parse(options)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)  # checks the options
        self.slo = SLOOptions.parse(self.options)
        #: The step-time model the budgets come from.
        self.predictor = StepTimePredictor(self.slo.cost_model, adapt=self.slo.adapt)
        #: Requests refused by load shedding, and requests moved to the late group.
        self.num_shed = 0
        self.num_late = 0
        self._deadline: dict[str, float] = {}
        self._itl: dict[str, float] = {}
        self._late: set[str] = set()
        self._order: list[Request] = []
        self._planned: dict[str, int] = {}
        self._target = math.inf
        self._base = 0.0
        self._now = 0.0
        self._time_left = 0.0
        self._first_chunk = True
        self._rows = 0  # tokens of the step scheduled so far (schedule_waiting)
        self._num_decodes = 0  # decode rows of the step being planned
        self._gaps = 0.0
        self._misses = 0.0
        self.num_rescued = 0
        log_plan_basis(self.slo, self.predictor, self.config.max_num_seqs, logger)

    # ----------------------------------------------------------- bookkeeping

    def enqueue_waiting(self, request: Request) -> None:
        """Resolve the request's targets and deadline, then queue it (FIFO;
        the order is decided per step)."""
        targets = self.slo.targets(request)
        self._deadline[request.request_id] = request.arrival_time + targets.ttft_s
        self._itl[request.request_id] = targets.itl_s
        self.waiting.add_request(request)

    def on_finished(self, request: Request) -> None:
        """Forget its targets."""
        rid = request.request_id
        self._deadline.pop(rid, None)
        self._itl.pop(rid, None)
        self._late.discard(rid)

    def deadline(self, request: Request) -> float:
        """Its TTFT deadline on :attr:`clock` (arrival + TTFT target), seconds."""
        return self._deadline[request.request_id]

    def on_step_time(self, out: SchedulerOutput, seconds: float) -> None:
        """Fold the measured step into the step-time model (the plan's work as
        of planning: the engine built ``out.batch_arrays()`` before the step)."""
        _, computed, scheduled = out.batch_arrays()
        prompts = np.fromiter((r.num_prompt_tokens for r in out.scheduled), np.int64,
                              len(out.scheduled))  # fmt: skip
        self.predictor.observe(StepWork.from_arrays(computed, scheduled, prompts), seconds)
        decodes = [r for r, c, n, p in zip(out.scheduled, computed, scheduled, prompts)
                   if n == 1 and c >= p]  # fmt: skip
        keep = (1.0 - 1.0 / MISS_WINDOW) ** len(decodes)
        self._gaps = self._gaps * keep + len(decodes)
        self._misses = self._misses * keep + sum(
            seconds > self._itl.get(r.request_id, math.inf) for r in decodes)
        if self.predictor.num_observed % LOG_EVERY == 0:
            logger.debug(
                "slo: step-time multipliers %s (overhead, prefill, decode, kv, prefill kv, "
                "first tokens); gaps over target %.1f%% recently; late %d, rescued %d, shed %d",
                np.round(self.predictor.multipliers, 3).tolist(),
                100 * self._misses / max(self._gaps, 1), self.num_late, self.num_rescued,
                self.num_shed)  # fmt: skip

    @staticmethod
    def is_decoding(request: Request) -> bool:
        """Its prompt is cached and one token is left to compute (a decode row)."""
        return (request.num_tokens - request.num_computed_tokens == 1
                and request.num_computed_tokens >= request.num_prompt_tokens)  # fmt: skip

    # ------------------------------------------------------------- the plan

    def order_running(self, running: list[Request]) -> list[Request]:
        """Plan the step (step-time target, budget, prefill order) and return
        the decodes first, then the running prefills in plan order."""
        now = self._now = self.clock()
        decoding = [r for r in running if self.is_decoding(r)]
        prefilling = [r for r in running if not self.is_decoding(r)]
        self._num_decodes = len(decoding)
        pred = self.predictor
        self._base = pred.decode_time(len(decoding), sum(r.num_computed_tokens + 1
                                                         for r in decoding))  # fmt: skip
        if decoding:
            itl = min(self._itl[r.request_id] for r in decoding)
            self._target = itl * (1.0 - self.slo.margin) / pred.spread
        else:
            self._target = pred.overhead + pred.chunk_time(self.config.max_num_batched_tokens, 0)
        self._order = self.prefill_order(now, prefilling + list(self.waiting))
        self._planned, used = self._reserve(running, decoding)
        if decoding and self._late and self.slo.itl_miss_budget > 0:
            self._rescue(now, running, decoding, used)
        planned = [r for r in self._order if r.request_id in self._planned]
        rest = [r for r in prefilling if r.request_id not in self._planned]
        return decoding + planned + rest

    def prefill_order(self, now: float, candidates: Sequence[Request]) -> list[Request]:
        """Prefill candidates in the order they get the step's time: preempted
        requests that already streamed tokens, then those that can meet their
        deadline (earliest first), then the late ones (earliest first); see
        the class doc. Updates the late group."""
        resumed = [r for r in candidates if r.num_output_tokens > 0]
        fresh = sorted((r for r in candidates if r.num_output_tokens == 0), key=self.deadline)
        per_step = self._prefill_rate()
        work = sum(self._work(r) for r in resumed)
        heap: list[tuple[float, int, Request]] = []
        late = {r.request_id for r in fresh[MAX_CANDIDATES:]}
        for i, r in enumerate(fresh[:MAX_CANDIDATES]):
            p = self._work(r)
            work += p
            heapq.heappush(heap, (-p, i, r))
            # ``k`` steps, each paying the decodes, and the prefill work once
            k = math.ceil(work / per_step - 1e-9) if per_step > 0 else 0  # free prefill
            if now + k * self._base + work > self.deadline(r):
                neg, _, dropped = heapq.heappop(heap)
                work += neg
                late.add(dropped.request_id)
        self.num_late += len(late - self._late)
        self._late = late
        on_time = [r for r in fresh if r.request_id not in late]
        return resumed + on_time + [r for r in fresh if r.request_id in late]

    def _prefill_rate(self) -> float:
        """Prefill seconds per step at this step's target: what the decodes
        leave, at least one ``min_chunk_tokens`` chunk."""
        floor = self.predictor.chunk_time(self.slo.min_chunk_tokens, 0)
        return max(self._target - self._base, floor)

    def _work(self, request: Request, rows_before: int | None = None) -> float:
        """Prefill seconds ``request`` still needs (no per-step overhead), in
        a step with ``rows_before`` tokens ahead of it (default: this step's
        decodes, which run first)."""
        remaining = request.num_tokens - request.num_computed_tokens
        rows = self._num_decodes if rows_before is None else rows_before
        return self.predictor.chunk_time(remaining, request.num_computed_tokens, rows)

    def _chunk(self, request: Request, seconds: float, first: bool, budget: int,
               rows_before: int) -> int:  # fmt: skip
        """Prompt tokens of ``request`` that fit ``seconds`` in a step that
        already has ``rows_before`` tokens (the first chunk of a step gets at
        least ``min_chunk_tokens``), within ``budget``."""
        n = self.predictor.chunk_fitting(seconds, request.num_computed_tokens, rows_before)
        if first:
            n = max(n, self.slo.min_chunk_tokens)
        return min(n, request.num_tokens - request.num_computed_tokens, budget)

    def _reserve(self, running: list[Request],
                 decoding: list[Request]) -> tuple[dict[str, int], float]:  # fmt: skip
        """Walk the order handing out the step's prefill time in chunks.

        Returns:
            ``({request_id: tokens}, prefill seconds handed out)``; running
            prefills get their chunk in the running phase, waiting requests
            when :meth:`schedule_waiting` admits them.
        """
        left = self._target - self._base
        tokens, slots = self._room(running, decoding)
        planned: dict[str, int] = {}
        used = 0.0
        rows = len(decoding)
        for r in self._order:
            waiting = r.status in _WAITING
            if not self._admissible(r, slots):
                continue  # its time goes to the next
            n = self._chunk(r, left - used, not planned, tokens, rows)
            if n <= 0:
                break
            used += self.predictor.chunk_time(n, r.num_computed_tokens, rows)
            rows += n
            tokens -= n
            slots -= waiting
            planned[r.request_id] = n
        return planned, used

    def _room(self, running: list[Request], decoding: list[Request]) -> tuple[int, int]:
        """``(prompt tokens, sequence slots)`` this step has beyond its decodes
        and the running requests."""
        return (self.config.max_num_batched_tokens - len(decoding),
                self.config.max_num_seqs - len(running))  # fmt: skip

    def _admissible(self, request: Request, slots: int) -> bool:
        """Running, or waiting with a free sequence slot (of ``slots``) and
        room for its whole prompt (:meth:`fits`)."""
        return request.status not in _WAITING or (slots > 0 and self.fits(request))

    def _rescue(self, now: float, running: list[Request], decoding: list[Request],
                used: float) -> None:  # fmt: skip
        """Save a late request's deadline with one longer step when the ITL
        miss budget allows.

        Walking the order, every request before the first late one that can
        still make its deadline gets its whole remaining prompt in this step,
        and so does that late one; the step's target grows to fit them. The
        decodes whose ITL target the step then exceeds count against
        ``itl_miss_budget``; if that is spent, the plan stays as it was.
        """
        tokens, slots = self._room(running, decoding)
        plan: dict[str, int] = {}
        work = 0.0
        rows = len(decoding)
        for r in self._order:
            waiting = r.status in _WAITING
            remaining = r.num_tokens - r.num_computed_tokens
            late = r.request_id in self._late
            fits = remaining <= tokens and self._admissible(r, slots)
            cost = self._work(r, rows)
            if late and fits and now + self._base + work + cost <= self.deadline(r):
                plan[r.request_id] = remaining
                work += cost
                break
            if late or not fits:
                continue
            plan[r.request_id] = remaining
            work += cost
            tokens -= remaining
            slots -= waiting
            rows += remaining
        else:
            return  # no late request can be saved
        t = self._base + work
        misses = sum(t > self._itl[d.request_id] for d in decoding)
        if self._misses + misses > self.slo.itl_miss_budget * (self._gaps + len(decoding)):
            return
        saved = [r for r in self._order if r.request_id in plan]
        self._order = saved + [r for r in self._order if r.request_id not in plan]
        self._late.difference_update(plan)
        self._planned = plan
        self._target = max(t, self._target)
        self.num_rescued += 1

    def num_tokens_to_schedule(self, request: Request, token_budget: int) -> int:
        """1 for a decode; a planned chunk; for a request admitted beyond the
        plan, the chunk that fits the time left this step."""
        remaining = request.num_tokens - request.num_computed_tokens
        if self.is_decoding(request):
            return 1
        planned = self._planned.get(request.request_id)
        if planned is not None:
            return min(planned, remaining, token_budget)
        if request.status == RequestStatus.RUNNING:
            return 0
        return self._chunk(request, self._time_left, self._first_chunk, token_budget,
                           self._rows)

    def can_admit(self, request: Request) -> bool:
        """Only when the whole prompt :meth:`fits` (no thrashing, as chunked_prefill)."""
        return self.fits(request)

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Shed hopeless requests (``load_shedding``), then admit waiting
        requests in plan order: the planned ones with their chunks, then
        others while the step's time lasts.

        Returns:
            The budget left.
        """
        if self.slo.load_shedding:
            self._shed(out)
        self._time_left = self._target - self._predict(out)
        self._first_chunk = all(self.is_decoding(r) for r in out.scheduled)
        self._rows = sum(out.num_scheduled_tokens)
        for r in self._order:
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if r.status not in _WAITING:  # running, or refused by _shed
                continue
            planned = r.request_id in self._planned
            if not planned and self._time_left <= 0 and not self._first_chunk:
                break
            n = self.admit(r, out, budget)
            if n == 0:
                if r.request_id in self._late:
                    continue
                break  # an on-time request that does not fit: nobody overtakes it
            budget -= n
            self._time_left -= self.predictor.chunk_time(n, r.num_computed_tokens, self._rows)
            self._rows += n
            self._first_chunk = False
        return budget

    def _predict(self, out: SchedulerOutput) -> float:
        """Predicted seconds of the step planned so far."""
        pred = self.predictor
        t = pred.overhead
        rows = 0
        for r, n in zip(out.scheduled, out.num_scheduled_tokens):
            if n == 1 and r.num_computed_tokens >= r.num_prompt_tokens:
                t += pred.a_decode + pred.a_kv * (r.num_computed_tokens + 1)
            else:
                t += pred.chunk_time(n, r.num_computed_tokens)
            rows += n
        return t + pred.a_first_tokens * min(rows, pred.first_tokens)

    def _shed(self, out: SchedulerOutput) -> None:
        """Refuse each waiting request that has not started and would miss its
        deadline even if its whole prompt ran in this step (less what the
        prefix cache holds of it, looked up only for requests that would
        otherwise be refused)."""
        rows = sum(out.num_scheduled_tokens)  # the decodes, ahead of its prompt
        for r in [r for r in self.waiting if r.num_output_tokens == 0]:
            finish = self._now + self._base + self._work(r, rows)
            if finish > self.deadline(r) and (cached := self.num_cached_prefix_tokens(r)):
                finish = self._now + self._base + self.predictor.chunk_time(
                    r.num_tokens - cached, cached, rows)  # fmt: skip
            if finish > self.deadline(r):
                target = self.slo.targets(r).ttft_s
                self.reject(r, out, f"load shedding: cannot meet the TTFT target of "
                                    f"{target:g} s (slo scheduler)")  # fmt: skip
                self.num_shed += 1

    def select_victim(self, running: Sequence[Request]) -> Request:
        """The running prefill with the latest deadline, else the most recently
        admitted request (KV blocks ran out)."""
        prefilling = [r for r in running if r.num_output_tokens == 0]
        if prefilling:
            return max(prefilling, key=self.deadline)
        return running[-1]
