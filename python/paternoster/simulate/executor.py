"""The simulator: the real EngineCore with a cost-model runner on a simulated clock.

:func:`simulate` builds a real :class:`~paternoster.engine.core.EngineCore`
around a :class:`~paternoster.simulate.runner.CostModelRunner`: the policy
registered under the entry-point group ``paternoster.schedulers`` plans each
step against the real C++ ``KVCacheManager``; the real C++ ``BatchBuilder``
flattens the plan (so a plan the engine would reject fails here too); the
step then "takes" ``cost_model.step_time(work)`` on a
:class:`~paternoster.simulate.runner.SimClock` and every request whose
scheduled tokens reach its end receives a token at the step's end. There is
no second copy of the step loop: this module only feeds arrivals and reads
the results. Iteration-level scheduling after Orca (Yu et al., OSDI'22);
chunked prefill after Sarathi-Serve (Agrawal et al., OSDI'24).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from paternoster import _core
from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreRequest
from paternoster.model.interface import ModelInput
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel, StepWork
from paternoster.scheduling.registry import load_scheduler_class
from paternoster.simulate.results import RequestMetrics, SimStep, SimulationResult
from paternoster.simulate.runner import FAKE_TOKEN, CostModelRunner, SimClock
from paternoster.simulate.trace import TraceRequest

__all__ = ["FAKE_TOKEN", "simulate"]


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
    seed: int = 0,
) -> SimulationResult:
    """Run ``trace`` through a scheduler policy on a simulated clock.

    Deterministic: the same arguments give the same result (no wall clock; the
    only randomness, the cost model's ``step_noise``, is drawn from ``seed``).
    A whole-prompt policy (``supports_chunked_prefill`` false)
    gets its token budget raised to ``max_model_len``, as ``EngineCore`` does.
    Prefix caching is off (every trace request has its own prompt). The
    process's torch and core thread counts and torch's RNG state, which the
    engine sets, are restored afterwards.

    Args:
        trace: the requests (any order; ties in ``arrival_time`` keep trace order).
        scheduler: registered policy name (``fcfs``, ``chunked_prefill``,
            ``priority``, ``static``, or a third-party one).
        scheduler_config: the policy's options (``--scheduler-config``).
        cost_model: step-time model; default
            :data:`~paternoster.scheduling.cost_model.DEFAULT_COST_MODEL` (calibrated on the
            project's 2-core CPU); :meth:`CostModel.unit` counts steps.
        num_kv_blocks: KV cache blocks (default: what ``serve`` allocates for
            the default model, 1 GiB at bf16). block_size: tokens per block.
        max_num_seqs: most requests per step.
        max_num_batched_tokens: token budget per step.
        max_model_len: context cap in tokens (prompt + output).
        max_steps: safety cap on the number of steps.
        seed: seeds the step-time noise (a cost model with ``step_noise`` > 0).
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
    if not load_scheduler_class(scheduler).supports_chunked_prefill:
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    config = EngineConfig(
        model=ModelConfig(model="cost-model", max_model_len=max_model_len),
        cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks,
                          enable_prefix_caching=False),
        scheduler=SchedulerConfig(
            scheduler=scheduler,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            policy_config=dict(scheduler_config or {}),
        ),
        num_threads=1,  # the cost model computes nothing: no thread pools to size
    )
    metrics, requests = _make_requests(trace, max_model_len, num_kv_blocks * block_size)
    index = {r.request_id: i for i, r in enumerate(requests)}
    order = sorted(range(len(trace)), key=lambda i: (trace[i].arrival_time, i))
    engine_requests: list[Request | None] = [None] * len(trace)
    steps: list[SimStep] = []

    def on_step(model_input: ModelInput, work: StepWork, start: float, end: float) -> None:
        """Record the step as planned (before the engine's update)."""
        rows = []
        for r, c, n in zip(model_input.requests, model_input.num_computed_tokens.tolist(),
                           model_input.num_scheduled_tokens.tolist()):
            i = index[r.request_id]
            if metrics[i].first_scheduled_time is None:
                metrics[i].first_scheduled_time = start
                engine_requests[i] = r
            kind = "decode" if n == 1 and c >= r.num_prompt_tokens else "prefill"
            rows.append((i, n, kind))
        steps.append(SimStep(
            index=len(steps) + 1, start=start, end=end, rows=tuple(rows),
            preempted=tuple(index[r.request_id] for r in model_input.preempted),
            prefill_tokens=work.prefill_tokens, decode_tokens=work.decode_tokens,
            kv_tokens=work.kv_tokens, num_waiting=engine.scheduler.num_waiting,
            kv_cache_usage=engine.kv_cache_manager.usage(),
        ))  # fmt: skip

    clock = SimClock()
    runner = CostModelRunner(cost_model, clock, num_kv_blocks=num_kv_blocks,
                             block_size=block_size, max_model_len=max_model_len,
                             on_step=on_step, seed=seed)  # fmt: skip
    with _process_settings_kept():
        engine = EngineCore(config, runner, clock=clock)
        nxt = 0
        while nxt < len(order) or engine.has_unfinished_requests():
            while nxt < len(order) and trace[order[nxt]].arrival_time <= clock.now:
                i = order[nxt]
                engine.add_request(requests[i], arrival_time=metrics[i].arrival_time)
                nxt += 1
            if not engine.has_unfinished_requests():
                clock.advance_to(trace[order[nxt]].arrival_time)
                continue
            if runner.num_steps >= max_steps:
                raise RuntimeError(f"simulation did not finish within max_steps={max_steps}")
            ran = runner.num_steps
            outputs = engine.step()
            if runner.num_steps == ran and not outputs:  # the policy scheduled nothing
                if nxt < len(order):
                    clock.advance_to(trace[order[nxt]].arrival_time)
                    continue
                sched = engine.scheduler
                raise RuntimeError(
                    f"scheduler {scheduler!r} scheduled nothing with {sched.num_waiting} "
                    f"waiting and {sched.num_running} running requests and no arrival left"
                )
            for out in outputs:
                m = metrics[index[out.request_id]]
                m.token_times.extend([clock.now] * len(out.new_token_ids))
                m.num_output_tokens += len(out.new_token_ids)
                if out.finish_reason is not None:
                    m.finish_step = len(steps)
                if out.finish_reason == "error":  # refused by the policy (load shedding)
                    m.error = out.error or "error"
    for m, r in zip(metrics, engine_requests):
        m.num_preemptions = r.num_preemptions if r is not None else 0
    return SimulationResult(
        scheduler=scheduler,
        scheduler_config=dict(config.scheduler.policy_config),
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
        num_preemptions_total=engine.scheduler.num_preemptions_total,
        num_free_blocks_at_end=engine.kv_cache_manager.num_free_blocks(),
    )


@contextmanager
def _process_settings_kept() -> Iterator[None]:
    """Restore torch's and the core's thread counts and torch's RNG state,
    which ``EngineCore`` sets for its process."""
    threads, core_threads = torch.get_num_threads(), _core.get_num_threads()
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _core.set_num_threads(core_threads)
        torch.set_rng_state(rng)


def _make_requests(
    trace: list[TraceRequest], max_model_len: int, kv_capacity: int
) -> tuple[list[RequestMetrics], list[EngineCoreRequest]]:
    """Engine requests (greedy, ignore_eos, ``max_tokens = output_len``) and empty metrics."""
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
            EngineCoreRequest(
                request_id=rid,
                prompt_token_ids=[(i * 7 + j) % 997 + 2 for j in range(t.prompt_len)],
                sampling_params=params,
                priority=t.priority,
                tenant=t.tenant,
                slo_ttft_s=t.slo_ttft_s,
                slo_itl_s=t.slo_itl_s,
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
                tenant=t.tenant,
            )
        )
    return metrics, requests
