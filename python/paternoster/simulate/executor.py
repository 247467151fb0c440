"""The model-free executor: real scheduler classes, a virtual clock, a cost model.

It runs the loop of :class:`paternoster.engine.core.EngineCore` with the
forward pass replaced by the cost model: the policy registered under the
entry-point group ``paternoster.schedulers`` plans each step against the real
C++ ``KVCacheManager``; the real C++ ``BatchBuilder`` flattens the plan (so a
plan the engine would reject fails here too); the step then "takes"
``cost_model.step_time(work)`` and every request whose scheduled tokens reach
its end receives a token at the step's end. Iteration-level scheduling after
Orca (Yu et al., OSDI'22); chunked prefill after Sarathi-Serve (Agrawal et al.,
OSDI'24).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paternoster import _core
from paternoster.config import SchedulerConfig
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.registry import load_scheduler_class
from paternoster.simulate.cost_model import DEFAULT_COST_MODEL, CostModel, StepWork
from paternoster.simulate.results import RequestMetrics, SimStep, SimulationResult
from paternoster.simulate.trace import TraceRequest

#: The fake sampled token: any id works, EOS is ignored.
FAKE_TOKEN = 1


def simulate(
    trace: Sequence[TraceRequest],
    scheduler: str = "fcfs",
    scheduler_config: dict | None = None,
    cost_model: CostModel | None = None,
    *,
    num_kv_blocks: int = 2912,
    block_size: int = 16,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 8192,
    max_steps: int = 1_000_000,
) -> SimulationResult:
    """Run ``trace`` through a scheduler policy on a virtual clock.

    Deterministic: the same arguments give the same result (no wall clock, no
    randomness). A whole-prompt policy (``supports_chunked_prefill`` false)
    gets its token budget raised to ``max_model_len``, as ``EngineCore`` does.

    Args:
        trace: the requests (any order; ties in ``arrival_time`` keep trace order).
        scheduler: registered policy name (``fcfs``, ``chunked_prefill``,
            ``priority``, ``static``, or a third-party one).
        scheduler_config: the policy's options (``--scheduler-config``).
        cost_model: step-time model; default
            :data:`~paternoster.simulate.cost_model.DEFAULT_COST_MODEL` (calibrated on the
            project's 2-core CPU); :meth:`CostModel.unit` counts steps.
        num_kv_blocks: KV cache blocks (default: what ``serve`` allocates for
            the default model, 1 GiB at bf16). block_size: tokens per block.
        max_num_seqs: most requests per step.
        max_num_batched_tokens: token budget per step.
        max_model_len: context cap in tokens (prompt + output).
        max_steps: safety cap on the number of steps.
    Returns:
        Per-request metrics, per-step records and summaries.
    Raises:
        ValueError: unknown policy or options; a request longer than
            ``max_model_len`` or than the whole KV cache; duplicate request ids;
            a cost model that makes a step take no time.
        RuntimeError: the policy stops making progress with requests left, or
            ``max_steps`` is reached.
    """
    cost_model = cost_model or DEFAULT_COST_MODEL
    trace = list(trace)
    if not trace:
        raise ValueError("trace has no requests")
    cls = load_scheduler_class(scheduler)
    if not cls.supports_chunked_prefill:
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    config = SchedulerConfig(
        scheduler=scheduler,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        policy_config=dict(scheduler_config or {}),
    )
    kv = _core.KVCacheManager(num_kv_blocks, block_size)
    builder = _core.BatchBuilder(kv)
    sched = cls(config, kv, builder, max_model_len)
    metrics, requests = _make_requests(trace, max_model_len, num_kv_blocks * block_size)
    index = {r.request_id: i for i, r in enumerate(requests)}
    order = sorted(range(len(trace)), key=lambda i: (trace[i].arrival_time, i))

    steps: list[SimStep] = []
    clock, nxt = 0.0, 0
    while nxt < len(order) or sched.has_unfinished_requests():
        while nxt < len(order) and trace[order[nxt]].arrival_time <= clock:
            sched.add_request(requests[order[nxt]])
            nxt += 1
        if not sched.has_unfinished_requests():
            clock = trace[order[nxt]].arrival_time
            continue
        plan = sched.schedule()
        if plan.is_empty:
            if nxt < len(order):
                clock = trace[order[nxt]].arrival_time
                continue
            raise RuntimeError(
                f"scheduler {scheduler!r} scheduled nothing with {sched.num_waiting} waiting "
                f"and {sched.num_running} running requests and no arrival left"
            )
        if len(steps) >= max_steps:
            raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
        ids, computed, scheduled = plan.batch_arrays()
        builder.build(ids, computed, scheduled)  # the engine's own validation
        prompt = np.fromiter((r.num_prompt_tokens for r in plan.scheduled), np.int64, len(ids))
        work = StepWork.from_arrays(computed, scheduled, prompt)
        duration = cost_model.step_time(work)
        if not duration > 0:
            raise ValueError(f"cost model gives a step time of {duration} for {work}")
        start, clock = clock, clock + duration
        rows = []
        for r, c, n in zip(plan.scheduled, computed.tolist(), scheduled.tolist()):
            m = metrics[index[r.request_id]]
            if m.first_scheduled_time is None:
                m.first_scheduled_time = start
            kind = "decode" if n == 1 and c >= r.num_prompt_tokens else "prefill"
            rows.append((index[r.request_id], n, kind))
        sampled = {
            row: FAKE_TOKEN
            for row, (r, c, n) in enumerate(zip(plan.scheduled, computed, scheduled))
            if c + n == r.num_tokens
        }
        steps.append(
            SimStep(
                index=len(steps) + 1,
                start=start,
                end=clock,
                rows=tuple(rows),
                preempted=tuple(index[r.request_id] for r in plan.preempted),
                prefill_tokens=work.prefill_tokens,
                decode_tokens=work.decode_tokens,
                kv_tokens=work.kv_tokens,
                num_waiting=sched.num_waiting,
                kv_cache_usage=kv.usage(),
            )
        )
        for out in sched.update_from_output(plan, sampled):
            m = metrics[index[out.request_id]]
            m.token_times.extend([clock] * len(out.new_token_ids))
            m.num_output_tokens += len(out.new_token_ids)
            if out.finished:
                m.finish_step = len(steps)
    for m, r in zip(metrics, requests):
        m.num_preemptions = r.num_preemptions
    return SimulationResult(
        scheduler=scheduler,
        scheduler_config=dict(config.policy_config),
        settings={
            "num_kv_blocks": num_kv_blocks,
            "block_size": block_size,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len,
        },
        cost_model=cost_model.to_dict(),
        requests=metrics,
        steps=steps,
        num_preemptions_total=sched.num_preemptions_total,
        num_free_blocks_at_end=kv.num_free_blocks(),
    )


def _make_requests(
    trace: list[TraceRequest], max_model_len: int, kv_capacity: int
) -> tuple[list[RequestMetrics], list[Request]]:
    """Engine requests (ignore_eos, ``max_tokens = output_len``) and empty metrics."""
    metrics, requests, seen = [], [], set()
    for i, t in enumerate(trace):
        rid = t.request_id if t.request_id is not None else f"r{i}"
        if rid in seen:
            raise ValueError(f"duplicate request_id {rid!r} in the trace")
        seen.add(rid)
        total = t.prompt_len + t.output_len
        if total > max_model_len:
            raise ValueError(
                f"request {rid!r}: prompt_len + output_len = {total} exceeds "
                f"max_model_len ({max_model_len})"
            )
        if total > kv_capacity:
            raise ValueError(
                f"request {rid!r} needs {total} KV slots; the cache holds {kv_capacity}"
            )
        params = SamplingParams(temperature=0.0, max_tokens=t.output_len, ignore_eos=True)
        requests.append(
            Request(
                request_id=rid,
                prompt_token_ids=[(i * 7 + j) % 997 + 2 for j in range(t.prompt_len)],
                sampling_params=params,
                arrival_time=float(t.arrival_time),
                priority=t.priority,
                max_tokens=t.output_len,
            )
        )
        metrics.append(
            RequestMetrics(
                request_id=rid,
                tag=t.tag,
                priority=t.priority,
                arrival_time=float(t.arrival_time),
                prompt_len=t.prompt_len,
                output_len=t.output_len,
            )
        )
    return metrics, requests
