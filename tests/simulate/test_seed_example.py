"""The seed example: continuous batching frees a slot the moment a request ends."""

from __future__ import annotations

import pytest

from paternoster.simulate import CostModel, TraceRequest, simulate


def seed_trace() -> list[TraceRequest]:
    """A, B and C arrive together with 4-token prompts; A generates 2 tokens, B 4, C 2.

    The step that computes a prompt also samples its first token, so a request
    with ``output_len = k`` occupies its slot for exactly ``k`` steps. With two
    slots (``max_num_seqs=2``) A and B run from step 1: A needs 2 steps (ends at
    step 2), B needs 4 (ends at step 4), and C waits needing 2.
    """
    return [
        TraceRequest(0.0, 4, 2, request_id="A"),
        TraceRequest(0.0, 4, 4, request_id="B"),
        TraceRequest(0.0, 4, 2, request_id="C"),
    ]


def run(policy: str):
    result = simulate(
        seed_trace(), policy, cost_model=CostModel.unit(),
        max_num_seqs=2, num_kv_blocks=16, block_size=4, max_model_len=16,
    )  # fmt: skip
    return {m.request_id: m for m in result.requests}


def test_static_batching_finishes_c_at_step_6():
    """Static batching refills only when the whole batch (A and B) has ended,
    after step 4: C runs in steps 5 and 6."""
    m = run("static")
    assert (m["A"].finish_step, m["B"].finish_step, m["C"].finish_step) == (2, 4, 6)
    assert m["C"].finish_time == 6.0
    assert m["C"].queue_time == 4.0


def test_continuous_batching_finishes_c_at_step_4():
    """Iteration-level (continuous) batching (Orca, OSDI'22) gives A's slot to C
    at step 3: C runs in steps 3 and 4, next to B."""
    m = run("fcfs")
    assert (m["A"].finish_step, m["B"].finish_step, m["C"].finish_step) == (2, 4, 4)
    assert m["C"].finish_time == 4.0
    assert m["C"].queue_time == 2.0


@pytest.mark.parametrize("policy", ["fcfs", "chunked_prefill", "priority", "static", "fair"])
def test_unit_cost_time_counts_steps(policy):
    """With the unit cost model every token time is a whole step number."""
    result = simulate(seed_trace(), policy, cost_model=CostModel.unit(), max_num_seqs=2,
                      num_kv_blocks=16, block_size=4, max_model_len=16)  # fmt: skip
    for step in result.steps:
        assert step.end - step.start == 1.0
    assert all(t == int(t) for m in result.requests for t in m.token_times)
