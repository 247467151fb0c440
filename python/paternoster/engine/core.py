"""EngineCore: the step loop that ties scheduler, C++ batch builder and model together."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from paternoster import _core
from paternoster.config import EngineConfig
from paternoster.engine.messages import EngineCoreOutput, EngineCoreRequest
from paternoster.logprobs import Logprobs, compute_logprobs
from paternoster.metrics.timeline import TimelineRecorder
from paternoster.model.logits_processors import apply_logits_processors
from paternoster.model.runner import ModelRunner
from paternoster.model.sampler import Sampler
from paternoster.request import Request
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.registry import load_scheduler_class

logger = logging.getLogger(__name__)

STEP_LOG_SIZE = 4096


@dataclass(frozen=True)
class StepRecord:
    """What one engine step ran.

    Attributes:
        step: step index (0-based, counts steps that ran a forward pass).
        start: ``time.monotonic()`` seconds when the step began.
        duration: wall seconds of the whole step.
        overhead: seconds spent outside the forward pass and sampling
            (schedule + batch build + update).
        scheduled: ``(request_id, num_scheduled_tokens)`` per request, batch order.
        num_preempted: requests preempted while planning this step.
    """

    step: int
    start: float
    duration: float
    overhead: float
    scheduled: tuple[tuple[str, int], ...]
    num_preempted: int


class EngineCore:
    """Owns the model, the paged KV cache and the scheduler; runs one step at a time.

    Args:
        config: model, cache and scheduler settings.
        model_runner: an already built runner (tests); built from ``config`` if None.
    Raises:
        ValueError: unknown scheduler name, unsupported architecture, bad sizes.
    """

    def __init__(self, config: EngineConfig, model_runner: ModelRunner | None = None) -> None:
        torch.set_num_threads(config.num_threads)
        _core.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        self.config = config
        self.runner = model_runner or ModelRunner(
            config.model, config.cache, max_num_seqs=config.scheduler.max_num_seqs,
            max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        )
        self.sampler = Sampler()
        self.max_model_len = self.runner.max_model_len
        self.kv_cache_manager = _core.KVCacheManager(
            self.runner.num_kv_blocks,
            self.runner.block_size,
            enable_caching=config.cache.enable_prefix_caching,
        )
        self.batch_builder = _core.BatchBuilder(self.kv_cache_manager)
        scheduler_cls = load_scheduler_class(config.scheduler.scheduler)
        sched_config = config.scheduler
        if (
            not scheduler_cls.supports_chunked_prefill
            and sched_config.max_num_batched_tokens < self.max_model_len
        ):
            logger.info(
                "scheduler %r keeps prompts whole: raising max_num_batched_tokens from %d to "
                "max_model_len (%d)",
                sched_config.scheduler,
                sched_config.max_num_batched_tokens,
                self.max_model_len,
            )
            sched_config = dataclasses.replace(
                sched_config, max_num_batched_tokens=self.max_model_len
            )
        self.scheduler = scheduler_cls(
            sched_config, self.kv_cache_manager, self.batch_builder, self.max_model_len
        )
        self.step_log: deque[StepRecord] = deque(maxlen=STEP_LOG_SIZE)
        # Request timelines (docs/metrics.md); None when off (the default).
        self.timeline = TimelineRecorder.from_config(config.timeline)
        self._num_steps = 0
        # Queue times (s) of requests scheduled but not yet reported in an output.
        self._unreported_queue_times: dict[str, float] = {}
        # Prompt logprobs computed so far, per request, until its first token is sent.
        self._prompt_logprobs: dict[str, Logprobs] = {}
        # Tokens each step computed, since the last pop_iteration_tokens().
        self._iteration_tokens: list[int] = []
        name = config.model.served_model_name or str(config.model.model).rstrip("/").split("/")[-1]
        self.info = {
            "model": name,
            "model_dir": str(config.model.model),
            "max_model_len": self.max_model_len,
            "num_kv_blocks": self.runner.num_kv_blocks,
            "block_size": self.runner.block_size,
            "eos_token_id": self.runner.eos_token_id,
            "vocab_size": self.runner.vocab_size,
            "scheduler": sched_config.scheduler,
        }

    # --------------------------------------------------------------- requests

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a tokenized request.

        Raises:
            ValueError: empty prompt, token id (prompt or ``logit_bias``) outside
                the vocabulary, ``n != 1``,
                prompt (+ ``max_tokens``) longer than ``max_model_len``, or a
                duplicate live ``request_id``.
        """
        ids = request.prompt_token_ids
        params = request.sampling_params
        if not ids:
            raise ValueError("prompt must contain at least one token")
        vocab = self.runner.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.n != 1:
            raise ValueError("the engine takes n=1 requests; the frontend fans out n > 1")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(ids)} tokens; max_model_len is {self.max_model_len} "
                "(prompt plus at least one output token must fit)"
            )
        room = self.max_model_len - len(ids)
        if params.max_tokens is not None and params.max_tokens > room:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})"
            )
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=list(ids),
            sampling_params=params,
            eos_token_id=self.runner.eos_token_id,
            priority=request.priority,
            max_tokens=params.max_tokens if params.max_tokens is not None else room,
        )
        self.scheduler.add_request(req)
        if self.timeline is not None:
            self.timeline.on_arrival(req)

    def abort_requests(self, request_ids: Iterable[str]) -> list[EngineCoreOutput]:
        """Abort live requests (waiting, running or preempted); unknown ids are ignored.

        Returns:
            A final output (``finish_reason="abort"``) for each aborted request.
        """
        aborted = self.scheduler.abort_requests(request_ids)
        for r in aborted:
            self._prompt_logprobs.pop(r.request_id, None)
        if self.timeline is not None and aborted:
            self.timeline.on_abort(aborted, time.monotonic())
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
        return self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------- step

    def step(self) -> list[EngineCoreOutput]:
        """Run one step: schedule, build the batch, forward, sample, update.

        Returns:
            Outputs for the requests that got a token (or finished) this step.
        """
        t0 = time.monotonic()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            if self.timeline is not None and plan.preempted:
                self.timeline.on_preempted(plan.preempted, self._num_steps, t0)
            return []
        self._note_first_scheduling(plan, t0)
        batch, rows, prompt_chunks = self._build_batch(plan)
        t1 = time.monotonic()
        logits = self.runner.execute_model(batch)
        sampled, logprobs = self._sample(plan, rows, logits[: len(rows)])
        if prompt_chunks:
            self._score_prompts(prompt_chunks, logits[len(rows) :])
        t2 = time.monotonic()
        outputs = self.scheduler.update_from_output(plan, sampled)
        t3 = time.monotonic()
        if self.timeline is not None:
            self.timeline.on_step(self._num_steps, plan, rows, t0, t3, outputs)
        self._record(plan, t0, t3, (t1 - t0) + (t3 - t2))
        self._attach_queue_times(outputs)
        self._attach_logprobs(outputs, logprobs)
        return outputs

    @torch.inference_mode()  # the logits are inference tensors, processed in place
    def _sample(
        self, plan: SchedulerOutput, rows: np.ndarray, logits: torch.Tensor
    ) -> tuple[dict[int, int], dict[str, Logprobs]]:
        """Logits processors, then one token per row; raw logprobs where asked.

        Args:
            plan: this step's plan.
            rows: indices into ``plan.scheduled`` of the requests that sample.
            logits: float32 [len(rows), V]; modified in place by the processors.
        Returns:
            ``({row: token id}, {request id: one-position Logprobs})``. Logprobs
            are of the model's distribution before penalties, bias and
            temperature (vLLM's default ``raw_logprobs``).
        """
        if not len(rows):
            return {}, {}
        reqs = [plan.scheduled[i] for i in rows]
        params = [r.sampling_params for r in reqs]
        want = [j for j, p in enumerate(params) if p.logprobs is not None]
        raw = logits[want].log_softmax(dim=-1) if want else None  # before processing
        apply_logits_processors(logits, reqs)
        tokens = self.sampler.sample(logits, params, [r.generator for r in reqs])
        sampled = dict(zip(rows.tolist(), tokens.tolist()))
        if not want:
            return sampled, {}
        lp = compute_logprobs(raw, tokens[want], [params[j].logprobs for j in want])
        return sampled, {reqs[j].request_id: lp.position(k) for k, j in enumerate(want)}

    def _score_prompts(
        self, chunks: list[tuple[Request, int, int]], logits: torch.Tensor
    ) -> None:
        """Prompt logprobs of this step's prefill chunks, kept until the first token.

        Args:
            chunks: ``(request, first position, count)``: the logits at prompt
                positions ``first .. first + count - 1`` score prompt tokens
                ``first + 1 .. first + count``.
            logits: float32 [sum of counts, V], the chunks' rows in order.
        """
        offset = 0
        for request, first, count in chunks:
            rows = logits[offset : offset + count].log_softmax(dim=-1)
            offset += count
            targets = torch.tensor(
                request.prompt_token_ids[first + 1 : first + 1 + count], device=rows.device
            )
            k = request.sampling_params.prompt_logprobs
            lp = compute_logprobs(rows, targets, [k] * count)
            self._prompt_logprobs.setdefault(request.request_id, Logprobs()).extend(lp)

    def _attach_logprobs(
        self, outputs: list[EngineCoreOutput], logprobs: dict[str, Logprobs]
    ) -> None:
        """Put this step's token logprobs, and the prompt logprobs of requests
        that got their first token, on their outputs."""
        if not logprobs and not self._prompt_logprobs:
            return
        for o in outputs:
            o.logprobs = logprobs.get(o.request_id)
            if self._prompt_logprobs and o.new_token_ids:
                o.prompt_logprobs = self._prompt_logprobs.pop(o.request_id, None)

    def _note_first_scheduling(self, plan: SchedulerOutput, now: float) -> None:
        """Stamp requests scheduled for the first time; remember their queue time."""
        for r in plan.scheduled:
            if r.first_scheduled_time is None:
                r.first_scheduled_time = now
                self._unreported_queue_times[r.request_id] = now - r.arrival_time

    def _attach_queue_times(self, outputs: list[EngineCoreOutput]) -> None:
        """Put each request's queue time on its first output after first scheduling."""
        for o in outputs:
            o.queue_time = self._unreported_queue_times.pop(o.request_id, None)

    def pop_iteration_tokens(self) -> list[int]:
        """Tokens the forward pass computed in each step since the last call.

        Returns:
            One count (tokens) per step that ran, oldest first; the log is cleared.
        """
        tokens, self._iteration_tokens = self._iteration_tokens, []
        return tokens

    def _build_batch(
        self, plan: SchedulerOutput
    ) -> tuple[dict[str, np.ndarray], np.ndarray, list[tuple[Request, int, int]]]:
        """Flat batch arrays, the rows whose prefill completes (they sample), and
        the prompt chunks whose logprobs were asked for.

        ``logits_indices`` holds the sampling rows' last tokens first, then the
        positions of each prompt chunk (``(request, first position, count)``).
        """
        ids, computed, scheduled = plan.batch_arrays()
        batch = self.batch_builder.build(ids, computed, scheduled)
        num_tokens = np.fromiter((r.num_tokens for r in plan.scheduled), np.int64, len(ids))
        rows = np.nonzero(computed.astype(np.int64) + scheduled == num_tokens)[0]
        batch["logits_indices"] = batch["logits_indices"][rows]
        chunks: list[tuple[Request, int, int]] = []
        starts: list[np.ndarray] = []
        qsl = batch["query_start_loc"]
        for i, r in enumerate(plan.scheduled):
            if r.sampling_params.prompt_logprobs is None or r.output_token_ids:
                continue  # none asked, or sent already (a preempted request recomputes)
            done = len(self._prompt_logprobs.get(r.request_id) or ())
            first = max(int(computed[i]), done)
            # The logit at position p scores prompt token p + 1; the last prompt
            # position's logit is the first sample.
            end = min(int(computed[i]) + int(scheduled[i]), r.num_prompt_tokens - 1)
            if end > first:
                chunks.append((r, first, end - first))
                starts.append(np.arange(end - first) + int(qsl[i]) + first - int(computed[i]))
        if chunks:
            batch["logits_indices"] = np.concatenate([batch["logits_indices"], *starts])
        return batch, rows, chunks

    def _record(self, plan: SchedulerOutput, start: float, end: float, overhead: float) -> None:
        self.step_log.append(
            StepRecord(
                step=self._num_steps,
                start=start,
                duration=end - start,
                overhead=overhead,
                scheduled=tuple(
                    (r.request_id, n) for r, n in zip(plan.scheduled, plan.num_scheduled_tokens)
                ),
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
            up in the prefix cache on admission, and how many were cached).
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

    def shutdown(self) -> None:
        """Abort everything still live (frees all KV blocks)."""
        self.abort_requests(list(self.scheduler.requests))
