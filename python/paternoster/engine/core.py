"""EngineCore: the step loop that ties scheduler, C++ batch builder and model together."""

from __future__ import annotations

import operator
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np
import torch

from paternoster import _core
from paternoster.config import EngineConfig
from paternoster.engine.assembly import (
    fit_scheduler_config,
    make_kv_cache_manager,
    make_runner,
    resolve_engine_threads,
    served_model_name,
)
from paternoster.engine.cpu_threads import ThreadChoice
from paternoster.engine.grammar_queue import COMPILE_WAIT_S, GrammarQueue
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.engine.prompt_logprobs import PromptLogprobsTracker
from paternoster.engine.request_checks import check_request
from paternoster.engine.step_record import StepRecord
from paternoster.metrics.timeline import TimelineRecorder
from paternoster.model.interface import ModelInput, ModelRunnerOutput, Runner
from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.registry import load_scheduler_class

STEP_LOG_SIZE = 4096
# C-level attribute reads for the per-request loops of a step (twice as fast as a
# generator expression over 256 requests).
_REQUEST_ID = operator.attrgetter("request_id")
_NUM_TOKENS = operator.attrgetter("num_tokens")


class EngineCore:
    """Owns the runner, the paged KV cache and the scheduler; runs one step at a time.

    A step reads schedule → build → execute → update: the scheduler plans,
    the C++ ``BatchBuilder`` flattens the plan into a
    :class:`~paternoster.model.interface.ModelInput`, the runner returns the
    sampled tokens (:class:`~paternoster.model.interface.ModelRunnerOutput`)
    and the scheduler appends them and checks stops.

    Args:
        config: model, cache and scheduler settings (``config.cache``'s block
            count and size are the runner's when one is given).
        model_runner: any :class:`~paternoster.model.interface.Runner`: the
            real :class:`~paternoster.model.runner.ModelRunner` (built from
            ``config`` if None; with ``config.tensor_parallel_size`` > 1 this
            process is rank 0 and starts the other ranks:
            :mod:`paternoster.engine.tensor_parallel`), a test double, or the
            simulator's cost-model runner.
        clock: seconds, monotonic; stamps arrivals, queue times and the step
            log (the simulator passes its simulated clock).
    Attributes:
        threads: the thread count used (torch intra-op and C++ core pools) and
            how it was chosen; also ``info["num_threads"]``.
    Raises:
        ValueError: unknown scheduler name, unsupported architecture, bad
            sizes, ``PATERNOSTER_NUM_THREADS`` not an int >= 1, a model that
            tensor parallel does not split.
        RuntimeError: a tensor-parallel worker exited or did not start in time.
    """

    def __init__(self, config: EngineConfig, model_runner: Runner | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        tp = config.tensor_parallel_size > 1 and model_runner is None
        self.threads: ThreadChoice
        config, self.threads = resolve_engine_threads(config, tp)
        torch.set_num_threads(config.num_threads)
        _core.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.config = config
        self._clock = clock
        self.runner: Runner = model_runner if model_runner is not None else make_runner(config, tp)
        self.max_model_len = self.runner.max_model_len
        self.kv_cache_manager = make_kv_cache_manager(
            self.runner, config.cache.enable_prefix_caching)
        self.batch_builder = _core.BatchBuilder(self.kv_cache_manager)
        scheduler_cls = load_scheduler_class(config.scheduler.scheduler)
        sched_config, self.max_model_len = fit_scheduler_config(
            scheduler_cls, config.scheduler, self.runner, self.max_model_len)
        self.scheduler = scheduler_cls(
            sched_config, self.kv_cache_manager, self.batch_builder, self.max_model_len
        )
        self.scheduler.clock = clock  # deadlines are on the clock arrivals are on
        self.step_log: deque[StepRecord] = deque(maxlen=STEP_LOG_SIZE)
        # Request timelines (docs/metrics.md); None when off (the default).
        self.timeline = TimelineRecorder.from_config(config.timeline)
        self._num_steps = 0
        # End of the previous step when requests were left running (the next
        # step follows back to back: the time between counts towards the gap).
        self._busy_since: float | None = None
        # Queue times (s) of requests scheduled but not yet reported in an output.
        self._unreported_queue_times: dict[str, float] = {}
        # Prompt logprobs wanted, and computed so far, until the first token is sent.
        self._prompt_logprobs = PromptLogprobsTracker()
        # Tokens each step computed, since the last pop_iteration_tokens().
        self._iteration_tokens: list[int] = []
        # Requests whose grammar is still compiling (longer than COMPILE_WAIT_S),
        # in arrival order: they join the scheduler when it is done, so a slow
        # compile never holds the other requests' steps.
        self._compiling = GrammarQueue(self._load_tokenizer, self.runner.vocab_size,
                                       self.runner.eos_token_id)
        self.info = {
            "model": served_model_name(config.model),
            "model_dir": str(config.model.model),
            "max_model_len": self.max_model_len,
            "num_kv_blocks": self.runner.num_kv_blocks,
            "block_size": self.runner.block_size,
            "eos_token_id": self.runner.eos_token_id,
            "vocab_size": self.runner.vocab_size,
            "scheduler": sched_config.scheduler,
            "num_threads": config.num_threads,
            "batch_invariant": config.model.batch_invariant,
            "tensor_parallel_size": config.tensor_parallel_size if tp else 1,
        }

    # --------------------------------------------------------------- requests

    def _arrival(self, request: EngineCoreRequest) -> float:
        """``request.arrival_time`` (Unix s) on the engine clock, never in the future."""
        return self._clock() - max(0.0, time.time() - request.arrival_time)

    def add_request(self, request: EngineCoreRequest, *, arrival_time: float | None = None) -> None:
        """Queue a tokenized request.

        Args:
            request: the request.
            arrival_time: when it arrived, in the engine clock's seconds;
                default: ``request.arrival_time`` (wall clock, set by the
                frontend) on this clock, so queue times and arrival order
                include the time the request spent in the frontend and on the
                link. (The simulator passes the trace's times.)
        Raises:
            ValueError: empty prompt, token id (prompt or any token-id sampling field) outside
                the vocabulary, ``n != 1``,
                prompt (+ ``max_tokens``) longer than ``max_model_len``, a
                ``slo_ttft_s`` or ``slo_itl_s`` that is not a number > 0, or a
                duplicate live ``request_id``.
        """
        room = check_request(request, self.runner.vocab_size, self.max_model_len)
        params = request.sampling_params
        compiled = grammar = None
        if params.structured_outputs is not None:
            compiled, grammar = self._compiling.start(params.structured_outputs)
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling_params=params,
            eos_token_id=self.runner.eos_token_id,
            arrival_time=self._arrival(request) if arrival_time is None else arrival_time,
            priority=request.priority,
            cache_salt=request.cache_salt,
            tenant=request.tenant,
            slo_ttft_s=request.slo_ttft_s,
            slo_itl_s=request.slo_itl_s,
            max_tokens=params.max_tokens if params.max_tokens is not None else room,
            grammar=grammar,
        )
        if compiled is not None and grammar is None:
            self._compiling.park(req, compiled, params.structured_outputs)
        else:
            self.scheduler.add_request(req)
        if params.prompt_logprobs is not None:
            self._prompt_logprobs.want(req)
        if self.timeline is not None:
            self.timeline.on_arrival(req)

    def _load_tokenizer(self):
        """The model's tokenizer (for the grammar compiler, on its first use)."""
        from paternoster.model.loader import load_tokenizer

        return load_tokenizer(self.config.model.model)

    def abort_requests(self, request_ids: Iterable[str]) -> list[EngineCoreOutput]:
        """Abort live requests (waiting, running or preempted); unknown ids are ignored.

        Returns:
            A final output (``finish_reason="abort"``) for each aborted request.
        """
        request_ids = list(request_ids)
        parked = [self._compiling.pop(r) for r in request_ids if r in self._compiling]
        aborted = parked + self.scheduler.abort_requests(request_ids)
        for r in aborted:
            self._prompt_logprobs.forget(r.request_id)
        if self.timeline is not None and aborted:
            self.timeline.on_abort(aborted, self._clock())
        outputs = [
            EngineCoreOutput(
                request_id=r.request_id,
                new_token_ids=[],
                finish_reason="abort",
                num_prompt_tokens=r.num_prompt_tokens,
            )
            for r in aborted
        ]
        self._attach_queue_times(outputs)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._compiling) or self.scheduler.has_unfinished_requests()

    def _admit_compiled(self) -> list[EngineCoreOutput]:
        """Move the requests whose grammar finished compiling into the
        scheduler; a grammar that failed finishes its request with an error."""
        failed = []
        for req, compiled, spec in self._compiling.pop_compiled():
            rid = req.request_id
            try:
                req.grammar = self._compiling.state(compiled, spec)
            except ValueError as e:
                self._prompt_logprobs.forget(rid)
                if self.timeline is not None:
                    self.timeline.on_abort([req], self._clock())
                failed.append(EngineCoreOutput(
                    request_id=rid, new_token_ids=[], finish_reason="error", error=str(e),
                    num_prompt_tokens=req.num_prompt_tokens))  # fmt: skip
                continue
            self.scheduler.add_request(req)
        return failed

    # ------------------------------------------------------------------- step

    def step(self) -> list[EngineCoreOutput]:
        """Run one step: schedule, build the batch, execute (forward and sample), update.

        Returns:
            Outputs for the requests that got a token (or finished) this step.
        """
        failed = self._admit_compiled() if self._compiling else []
        t0 = self._clock()
        plan = self.scheduler.schedule()
        if plan.rejected:
            failed += self._rejected_outputs(plan, t0)
        if plan.is_empty:
            self._busy_since = None
            if self.timeline is not None and plan.preempted:
                self.timeline.on_preempted(plan.preempted, self._num_steps, t0)
            if self._compiling and not failed and not self.scheduler.has_unfinished_requests():
                self._compiling.wait(COMPILE_WAIT_S)
            return failed
        self._note_first_scheduling(plan, t0)
        model_input = self._build_input(plan)
        t1 = self._clock()
        result = self.runner.execute_model(model_input)
        t2 = self._clock()
        outputs = self.scheduler.update_from_output(plan, result.sampled_token_ids)
        t3 = self._clock()
        if self.timeline is not None:
            self.timeline.on_step(self._num_steps, plan, model_input.sample_rows, t0, t3, outputs)
        self._record(plan, t0, t3, (t1 - t0) + (t3 - t2))
        # The step's period as a decode sees it: from the previous step's end
        # when the engine stepped back to back (the loop's own work between
        # steps included), else from this step's start.
        start = t0 if self._busy_since is None else min(t0, self._busy_since)
        self.scheduler.on_step_time(plan, t3 - start)
        self._busy_since = t3 if self.scheduler.has_unfinished_requests() else None
        self._attach_queue_times(outputs)
        self._attach_logprobs(outputs, result)
        return failed + outputs

    def _rejected_outputs(self, plan: SchedulerOutput, now: float) -> list[EngineCoreOutput]:
        """Final outputs of the requests the policy refused this step (load
        shedding: ``overloaded``, which the frontend answers with 503)."""
        rejected = [r for r, _ in plan.rejected]
        for r in rejected:
            self._prompt_logprobs.forget(r.request_id)
        if self.timeline is not None:
            self.timeline.on_abort(rejected, now)
        return [EngineCoreOutput(request_id=r.request_id, new_token_ids=[], finish_reason="error",
                                 error=reason, overloaded=True,
                                 num_prompt_tokens=r.num_prompt_tokens)
                for r, reason in plan.rejected]  # fmt: skip

    def _attach_logprobs(self, outputs: list[EngineCoreOutput], result: ModelRunnerOutput) -> None:
        """Keep this step's prompt logprobs; put the token logprobs, and the
        prompt logprobs of requests that got their first token, on their outputs."""
        if result.logprobs:
            for o in outputs:
                o.logprobs = result.logprobs.get(o.request_id)
        self._prompt_logprobs.attach(outputs, result.prompt_logprobs)

    def _note_first_scheduling(self, plan: SchedulerOutput, now: float) -> None:
        """Stamp requests scheduled for the first time; remember their queue time."""
        for r in plan.scheduled:
            if r.first_scheduled_time is None:
                r.first_scheduled_time = now
                self._unreported_queue_times[r.request_id] = now - r.arrival_time

    def _attach_queue_times(self, outputs: list[EngineCoreOutput]) -> None:
        """Put each request's queue time on its first output after first scheduling."""
        if not self._unreported_queue_times:
            return
        for o in outputs:
            o.queue_time = self._unreported_queue_times.pop(o.request_id, None)

    def pop_iteration_tokens(self) -> list[int]:
        """Tokens the forward pass computed in each step since the last call.

        Returns:
            One count (tokens) per step that ran, oldest first; the log is cleared.
        """
        tokens, self._iteration_tokens = self._iteration_tokens, []
        return tokens

    def _build_input(self, plan: SchedulerOutput) -> ModelInput:
        """The runner's input: flat batch arrays, the rows whose prefill
        completes (they sample) and the prompt chunks whose logprobs were asked for.

        ``logits_indices`` holds the sampling rows' last tokens first, then the
        positions of each prompt chunk.
        """
        ids, computed, scheduled = plan.batch_arrays()
        batch = self.batch_builder.build(ids, computed, scheduled)
        num_tokens = np.fromiter(map(_NUM_TOKENS, plan.scheduled), np.int64, len(ids))
        rows = np.nonzero(computed.astype(np.int64) + scheduled == num_tokens)[0]
        batch["logits_indices"] = batch["logits_indices"][rows]
        chunks = self._prompt_logprobs.chunks(plan, batch, computed, scheduled)
        return ModelInput(plan.scheduled, plan.preempted, batch, computed, scheduled, rows, chunks)

    def _record(self, plan: SchedulerOutput, start: float, end: float, overhead: float) -> None:
        self.step_log.append(
            StepRecord(
                step=self._num_steps,
                start=start,
                duration=end - start,
                overhead=overhead,
                request_ids=tuple(map(_REQUEST_ID, plan.scheduled)),
                num_scheduled_tokens=tuple(plan.num_scheduled_tokens),
                num_preempted=len(plan.preempted),
            )
        )
        self._iteration_tokens.append(int(plan.total_num_scheduled_tokens))
        self._num_steps += 1

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict:
        """Counters for /health, metrics and tests.

        Returns:
            ``num_running``, ``num_waiting`` (requests), ``kv_cache_usage``
            (fraction of blocks in use), ``num_free_blocks``, ``num_kv_blocks``
            (blocks), ``num_preemptions_total``, ``num_steps``,
            ``prefix_cache_queries`` and ``prefix_cache_hits`` (tokens looked
            up in the prefix cache on admission, and how many were cached),
            ``state_slot_usage`` and ``num_free_state_slots`` (recurrent
            state slots of linear-attention models; 0 and 0 for others).
        """
        kv = self.kv_cache_manager
        return {
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            "kv_cache_usage": kv.usage(),
            "num_free_blocks": kv.num_free_blocks(),
            "num_kv_blocks": kv.num_blocks(),
            "num_preemptions_total": self.scheduler.num_preemptions_total,
            "num_steps": self._num_steps,
            "prefix_cache_queries": kv.prefix_cache_queries(),
            "prefix_cache_hits": kv.prefix_cache_hits(),
            "state_slot_usage": kv.state_usage(),
            "num_free_state_slots": kv.num_free_state_slots(),
        }

    def reset_prefix_cache(self) -> int:
        """Forget every cached KV block (for operators, e.g. after changing
        weights or to measure cold-cache latency). Running requests keep their
        blocks. Returns the number of blocks uncached (0 with prefix caching
        off)."""
        return self.kv_cache_manager.reset_prefix_cache()

    def timeline_snapshot(self) -> dict | None:
        """The request timeline recorded so far, as plain dicts and lists (schema in
        :mod:`paternoster.metrics.timeline`), or ``None`` when timelines are off."""
        return None if self.timeline is None else self.timeline.snapshot()

    def check_health(self) -> None:
        """Raise if the engine can no longer step: its runner's check (a dead
        tensor-parallel worker: ``RuntimeError`` naming it); else nothing."""
        check = getattr(self.runner, "check_health", None)
        if check is not None:
            check()

    def shutdown(self) -> None:
        """Abort everything still live (frees all KV blocks); stop the
        runner's tensor-parallel workers, if it has any."""
        try:
            self.abort_requests(list(self.scheduler.requests))
        finally:
            stop = getattr(self.runner, "shutdown", None)
            if stop is not None:
                stop()
