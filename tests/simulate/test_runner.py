"""The cost-model runner inside the real EngineCore: the simulated clock, the
fake tokens, and what the engine stamps with that clock."""

from __future__ import annotations

import time

import pytest

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreRequest
from paternoster.sampling_params import SamplingParams
from paternoster.simulate import CostModel, CostModelRunner, SimClock
from paternoster.simulate.runner import FAKE_TOKEN

# overhead 1 s, 0.5 s per prefill token, 0.25 s per decode token, nothing else.
COSTS = CostModel(overhead=1.0, a_prefill=0.5, a_decode=0.25, a_kv=0.0, a_kv_prefill=0.0)


def make_engine(budget: int = 64, scheduler: str = "chunked_prefill"):
    clock = SimClock()
    runner = CostModelRunner(COSTS, clock, num_kv_blocks=32, block_size=4, max_model_len=64)
    config = EngineConfig(
        model=ModelConfig(model="cost-model", max_model_len=64),
        cache=CacheConfig(block_size=4, num_kv_blocks=32, enable_prefix_caching=False),
        scheduler=SchedulerConfig(scheduler=scheduler, max_num_seqs=4,
                                  max_num_batched_tokens=budget),
    )  # fmt: skip
    return EngineCore(config, runner, clock=clock), runner, clock


def request(rid: str, prompt_len: int, max_tokens: int) -> EngineCoreRequest:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineCoreRequest(request_id=rid, prompt_token_ids=[5] * prompt_len,
                             sampling_params=params)  # fmt: skip


def test_each_step_advances_the_clock_by_its_cost_and_samples_the_fake_token():
    engine, runner, clock = make_engine()
    engine.add_request(request("a", 6, 2), arrival_time=0.0)
    engine.add_request(request("b", 2, 1), arrival_time=0.0)
    first = engine.step()  # prefills 6 + 2 tokens: 1 + 8 * 0.5 s
    assert clock() == 5.0
    assert {o.request_id: o.new_token_ids for o in first} == {"a": [FAKE_TOKEN], "b": [FAKE_TOKEN]}
    assert {o.request_id for o in first if o.finished} == {"b"}
    second = engine.step()  # one decode token: 1 + 0.25 s
    assert clock() == 6.25
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in second] == \
        [("a", [FAKE_TOKEN], "length")]  # fmt: skip
    assert runner.num_steps == 2
    assert [(r.start, r.duration, r.overhead) for r in engine.step_log] == \
        [(0.0, 5.0, 0.0), (5.0, 1.25, 0.0)]  # fmt: skip
    assert not engine.has_unfinished_requests()


def test_a_chunked_prompt_samples_only_when_its_last_chunk_runs():
    engine, runner, clock = make_engine(budget=4)
    engine.add_request(request("long", 10, 1), arrival_time=0.0)
    outputs = [engine.step() for _ in range(3)]  # chunks of 4, 4 and 2 tokens
    assert outputs[:2] == [[], []]
    assert [o.new_token_ids for o in outputs[2]] == [[FAKE_TOKEN]]
    assert clock() == 3 * 1.0 + 10 * 0.5


def test_queue_time_is_measured_on_the_simulated_clock():
    engine, _, clock = make_engine(scheduler="fcfs")
    clock.advance_to(3.0)
    engine.add_request(request("a", 4, 1), arrival_time=1.5)
    (out,) = engine.step()
    assert out.queue_time == 1.5  # first scheduled at 3.0, arrived at 1.5
    # Default arrival: the request's wall-clock arrival (2 s ago) on the engine clock.
    late = request("b", 4, 1)
    late.arrival_time = time.time() - 2.0
    engine.add_request(late)
    (out,) = engine.step()
    assert out.queue_time == pytest.approx(2.0, abs=0.5)


def test_a_cost_model_without_cost_is_refused():
    clock = SimClock()
    runner = CostModelRunner(CostModel(0.0, 0.0, 0.0, 0.0), clock, num_kv_blocks=8,
                             block_size=4, max_model_len=16)  # fmt: skip
    config = EngineConfig(model=ModelConfig(model="cost-model"),
                          cache=CacheConfig(block_size=4, num_kv_blocks=8))  # fmt: skip
    engine = EngineCore(config, runner, clock=clock)
    engine.add_request(request("a", 4, 1))
    with pytest.raises(ValueError, match="step time"):
        engine.step()


def test_the_clock_never_goes_back():
    clock = SimClock(2.0)
    clock.advance(0.5)
    clock.advance_to(4.0)
    assert clock() == 4.0
    with pytest.raises(ValueError, match="back"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="back"):
        clock.advance_to(3.0)


def _decode_step_times(step_noise: float, seed: int, steps: int = 400) -> list[float]:
    """Durations of ``steps`` one-token decode steps (1.25 s each without noise)."""
    from dataclasses import replace

    clock = SimClock()
    runner = CostModelRunner(replace(COSTS, step_noise=step_noise), clock, num_kv_blocks=128,
                             block_size=4, max_model_len=512, seed=seed)  # fmt: skip
    config = EngineConfig(
        model=ModelConfig(model="cost-model", max_model_len=512),
        cache=CacheConfig(block_size=4, num_kv_blocks=128, enable_prefix_caching=False),
        scheduler=SchedulerConfig(scheduler="fcfs", max_num_seqs=4, max_num_batched_tokens=512),
    )  # fmt: skip
    engine = EngineCore(config, runner, clock=clock)
    engine.add_request(request("a", 1, steps + 1), arrival_time=0.0)
    engine.step()  # the one-token prefill
    for _ in range(steps):
        engine.step()
    return [r.duration for r in list(engine.step_log)[1:]]


def test_step_noise_scatters_step_times_lognormally_around_the_model():
    import numpy as np

    quiet = _decode_step_times(0.0, seed=0)
    assert set(quiet) == {1.25}
    noisy = _decode_step_times(0.2, seed=0)
    assert noisy == _decode_step_times(0.2, seed=0)  # deterministic per seed
    assert noisy != _decode_step_times(0.2, seed=1)
    logs = np.log(np.asarray(noisy) / 1.25)
    # Median-preserving: log factors centred on 0 with sd 0.2 (400 draws:
    # the mean's standard error is 0.01, the sd's about 0.007).
    assert abs(float(np.mean(logs))) < 0.04 and 0.17 < float(np.std(logs)) < 0.23
