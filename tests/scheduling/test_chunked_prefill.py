"""chunked_prefill policy: budget sharing, chunk sizes, decodes first (no model)."""

from __future__ import annotations

import pytest

from .conftest import create_requests, create_scheduler, run_step


def test_long_prompt_is_split_and_decodes_keep_flowing():
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=16, max_model_len=128)
    (short,) = create_requests(1, prompt_len=4, max_tokens=20)
    s.add_request(short)
    run_step(s)  # short's prefill
    (long,) = create_requests(1, prompt_len=50, max_tokens=2)
    long.request_id = "long"
    s.add_request(long)
    chunks = []
    while long.num_computed_tokens < long.num_prompt_tokens:
        plan, _ = run_step(s)
        assert plan.total_num_scheduled_tokens <= 16
        sched = dict(zip((r.request_id for r in plan.scheduled), plan.num_scheduled_tokens))
        # The running decode is served first, every step, with one token.
        assert plan.scheduled[0] is short and sched["r0"] == 1
        chunks.append(sched["long"])
    assert chunks == [15, 15, 15, 5]
    assert long.num_output_tokens == 1  # sampled only when its prefill completed


def test_long_prefill_threshold_caps_one_request_per_step():
    s = create_scheduler(
        "chunked_prefill",
        max_num_batched_tokens=32,
        max_model_len=128,
        long_prefill_token_threshold=8,
    )
    for r in create_requests(2, prompt_len=20, max_tokens=1):
        s.add_request(r)
    plan, _ = run_step(s)
    assert plan.num_scheduled_tokens == [8, 8]


def test_budget_smaller_than_context_is_allowed_for_chunking():
    s = create_scheduler("chunked_prefill", max_num_batched_tokens=8, max_model_len=128)
    assert s.config.max_num_batched_tokens == 8


def test_negative_threshold_is_rejected_with_its_name():
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        create_scheduler("chunked_prefill", long_prefill_token_threshold=-1)


def test_unknown_option_is_rejected_with_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown scheduler_config keys.*long_prefill"):
        create_scheduler("chunked_prefill", no_such_option=1)
