"""The simulator is deterministic, finishes every request and frees every block."""

from __future__ import annotations

import pytest

from paternoster.simulate import CostModel, TraceRequest, simulate, synthetic_mix

POLICIES = ["fcfs", "chunked_prefill", "priority", "static", "fair"]
LIMITS = dict(num_kv_blocks=96, block_size=16, max_num_seqs=8, max_num_batched_tokens=256,
              max_model_len=1024)  # fmt: skip


def small_mix(seed: int = 3) -> list[TraceRequest]:
    """30 mixed requests arriving fast into a small KV cache (forces preemptions)."""
    return synthetic_mix(30, rate=20.0, seed=seed, max_model_len=LIMITS["max_model_len"])


@pytest.mark.parametrize("policy", POLICIES)
def test_same_input_gives_identical_results(policy):
    a = simulate(small_mix(), policy, **LIMITS).to_dict()
    b = simulate(small_mix(), policy, **LIMITS).to_dict()
    assert a == b


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_finishes_with_its_tokens_and_blocks_are_freed(policy):
    trace = small_mix()
    result = simulate(trace, policy, **LIMITS)
    assert [m.num_output_tokens for m in result.requests] == [t.output_len for t in trace]
    assert all(len(m.token_times) == m.output_len for m in result.requests)
    assert all(m.finish_step is not None for m in result.requests)
    assert result.num_free_blocks_at_end == LIMITS["num_kv_blocks"]
    budget = result.settings["max_num_batched_tokens"]
    for step in result.steps:
        assert step.prefill_tokens + step.decode_tokens <= budget
        assert len(step.rows) <= LIMITS["max_num_seqs"]
        assert step.end > step.start
    for m in result.requests:
        assert m.arrival_time <= m.first_scheduled_time < m.token_times[0]
        assert m.token_times == sorted(m.token_times)


def test_small_kv_cache_preempts_and_still_finishes():
    result = simulate(small_mix(), "chunked_prefill", **LIMITS)
    assert result.num_preemptions_total > 0
    assert sum(m.num_preemptions for m in result.requests) == result.num_preemptions_total
    assert result.num_free_blocks_at_end == LIMITS["num_kv_blocks"]


def test_idle_gaps_jump_to_the_next_arrival():
    trace = [TraceRequest(0.0, 4, 2), TraceRequest(10.0, 4, 1)]
    result = simulate(trace, "fcfs", cost_model=CostModel.unit(), max_model_len=64)
    first, second = result.requests
    assert first.token_times == [1.0, 2.0]
    assert second.token_times == [11.0]
    assert second.queue_time == 0.0


def test_summary_percentiles_and_throughput():
    trace = [TraceRequest(0.0, 4, 3), TraceRequest(0.0, 4, 3)]
    s = simulate(trace, "fcfs", cost_model=CostModel.unit(), max_model_len=64).summary()
    assert s["ttft"]["p50"] == 1.0 and s["itl"]["p95"] == 1.0 and s["e2e"]["max"] == 3.0
    assert s["throughput_output_tok_s"] == 2.0
    assert s["num_steps"] == 3


def test_request_longer_than_max_model_len_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        simulate([TraceRequest(0.0, 60, 10)], "fcfs", max_model_len=64)


def test_unknown_policy_lists_the_installed_ones():
    with pytest.raises(ValueError, match="fcfs"):
        simulate([TraceRequest(0.0, 4, 2)], "no_such_policy")


def test_policy_options_are_passed_through():
    trace = [TraceRequest(0.0, 100, 2)]
    result = simulate(trace, "chunked_prefill", {"long_prefill_token_threshold": 16},
                      cost_model=CostModel.unit(), max_model_len=256)  # fmt: skip
    assert max(s.prefill_tokens for s in result.steps) == 16
    with pytest.raises(ValueError, match="unknown scheduler_config"):
        simulate(trace, "fcfs", {"bogus": 1}, max_model_len=256)
