"""The slo policy in the simulator: decode gaps within the ITL target where
fcfs stalls them, the ITL miss budget, and load shedding."""

from __future__ import annotations

import numpy as np
import pytest

from paternoster.simulate import DEFAULT_COST_MODEL, TraceRequest, simulate, synthetic_mix

DECODERS = [f"d{i}" for i in range(4)]
ITL = 0.2


def trace() -> list[TraceRequest]:
    """Four short chats decoding from t=0; a 3000-token prompt arrives at t=1 s
    (about 4.5 s of prefill on the default cost model)."""
    reqs = [TraceRequest(0.0, 64, 80, request_id=rid) for rid in DECODERS]
    return [*reqs, TraceRequest(1.0, 3000, 8, request_id="long")]


def run(policy: str, config: dict | None = None, tr=None):
    return simulate(
        tr or trace(), policy, config, cost_model=DEFAULT_COST_MODEL,
        max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=4096,
        num_kv_blocks=512, block_size=16,
    )  # fmt: skip


def decode_gaps(result) -> list[float]:
    return [g for m in result.requests if m.request_id in DECODERS for g in m.itls]


def test_slo_keeps_every_decode_gap_within_the_itl_target_where_fcfs_does_not():
    """The same check on fcfs fails (its prefill step stalls every decode for
    seconds), so the check can tell; slo fits the long prompt around the
    decodes in steps of at most ITL x (1 - margin)."""
    strict = {"itl_s": ITL, "itl_miss_budget": 0.0}
    fcfs, slo = run("fcfs"), run("slo", strict)
    assert max(decode_gaps(fcfs)) > 10 * ITL
    assert max(decode_gaps(slo)) <= ITL * 0.95 + 1e-9  # the default margin: 5 %
    long = next(m for m in slo.requests if m.request_id == "long")
    assert long.num_output_tokens == 8  # and the prompt was served
    assert max(s.prefill_tokens for s in slo.steps) < 3000  # in chunks


def test_steps_with_decodes_stay_within_the_target_on_a_mix():
    """On a mixed trace every step that decodes is planned within the target:
    the simulator's step time is the cost model's, which the policy plans with."""
    tr = synthetic_mix(60, rate=0.3, seed=1, max_model_len=4096)
    res = run("slo", {"itl_s": 0.25, "margin": 0.0, "itl_miss_budget": 0.0}, tr)
    for s in res.steps:
        if s.decode_tokens and s.prefill_tokens > 16:  # beyond the progress guarantee
            assert s.end - s.start <= 0.25 + 1e-9
    assert all(m.num_output_tokens == m.output_len for m in res.requests)


def test_gaps_over_the_target_stay_within_the_itl_miss_budget():
    """Rescue steps (a late prompt run whole) may push decode gaps over the
    target, no more than the budget's share of them."""
    tr = synthetic_mix(200, rate=0.35, seed=0, max_model_len=4096)
    res = run("slo", {"itl_s": ITL, "itl_miss_budget": 0.04}, tr)
    gaps = np.concatenate([m.itls for m in res.requests if m.itls])
    assert np.mean(gaps > ITL) <= 0.04 + 0.01  # budget counted on a moving window


def test_load_shedding_refuses_what_cannot_make_it_and_the_rest_runs():
    """A 3000-token prompt cannot meet a 1 s TTFT target (it needs ~4.5 s of
    prefill): shed as an error; without shedding it runs late."""
    tr = [*trace()[:4], TraceRequest(1.0, 3000, 8, request_id="long")]
    shed = run("slo", {"ttft_s": 1.0, "load_shedding": True}, tr)
    late = run("slo", {"ttft_s": 1.0}, tr)
    [refused] = [m for m in shed.requests if m.error]
    assert refused.request_id == "long" and "TTFT target" in refused.error
    assert shed.summary()["num_errors"] == 1 and shed.summary()["num_requests"] == 5
    assert all(m.num_output_tokens == 80 for m in shed.requests if m.request_id in DECODERS)
    assert late.summary()["num_errors"] == 0
    assert next(m for m in late.requests if m.request_id == "long").ttft > 1.0


def test_the_engine_reports_each_steps_period_to_the_policy():
    """on_step_time gets the step's time (the cost model's, here) plus the
    engine's time between back-to-back steps (0.01 s of loop work here); the
    first step after an idle engine counts from its own start."""
    from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from paternoster.engine.core import EngineCore
    from paternoster.engine.messages import EngineCoreRequest
    from paternoster.sampling_params import SamplingParams
    from paternoster.simulate.runner import CostModelRunner, SimClock

    clock, steps, seen = SimClock(), [], []
    runner = CostModelRunner(DEFAULT_COST_MODEL, clock, num_kv_blocks=64, block_size=16,
                             max_model_len=512,
                             on_step=lambda _i, _w, start, end: steps.append(end - start))
    config = EngineConfig(model=ModelConfig(model="cost-model", max_model_len=512),
                          cache=CacheConfig(block_size=16, num_kv_blocks=64),
                          scheduler=SchedulerConfig(scheduler="slo"), num_threads=1)
    engine = EngineCore(config, runner, clock=clock)
    engine.scheduler.on_step_time = lambda _out, seconds: seen.append(seconds)
    for i in range(2):
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        engine.add_request(EngineCoreRequest(f"r{i}", [5] * 40, params), arrival_time=0.0)
    while engine.has_unfinished_requests():
        engine.step()
        clock.advance(0.01)
    assert len(seen) == len(steps) == 3
    assert seen[0] == pytest.approx(steps[0])
    assert seen[1:] == pytest.approx([s + 0.01 for s in steps[1:]])
