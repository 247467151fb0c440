"""Every built-in policy keeps the contract's invariants on random traces (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paternoster.request import Request
from paternoster.sampling_params import SamplingParams

from .conftest import create_scheduler, run_step

POLICIES = ["fcfs", "chunked_prefill", "priority", "static", "fair", "slo"]
CHUNKING = ("chunked_prefill", "fair", "slo")  # may split prompts: any budget

trace = st.lists(
    st.tuples(
        st.integers(0, 12),  # arrival step
        st.integers(1, 40),  # prompt length
        st.integers(1, 12),  # output length
        st.integers(0, 3),  # priority; also the tenant (0: anonymous)
    ),
    min_size=1,
    max_size=14,
)


def assert_kv_accounting(s, block_size: int) -> None:
    """Between steps (prefix caching off): running and waiting split the live
    requests, only running requests hold blocks, each holds blocks for its
    computed tokens, and the blocks in use are exactly the ones they hold."""
    kv = s.kv_cache_manager
    running = {r.request_id for r in s.running}
    waiting = {r.request_id for r in s.waiting}
    assert not running & waiting
    assert running | waiting == set(s.requests)
    held = 0
    for r in s.waiting:
        assert not kv.has_request(r.internal_id), "a waiting request holds KV blocks"
    for r in s.running:
        table = kv.block_table(r.internal_id)
        assert len(table) * block_size >= r.num_computed_tokens
        held += len(table)
    assert kv.num_blocks() - kv.num_free_blocks() == held, "blocks leaked or shared"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    requests=trace,
    num_blocks=st.integers(14, 60),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(8, 64),
)
def test_invariants_hold_on_random_traces(policy, requests, num_blocks, max_num_seqs, budget):
    block_size, max_model_len = 4, 52  # 13 blocks: any single request fits alone
    if policy not in CHUNKING:
        budget = max(budget, max_model_len)
    s = create_scheduler(
        policy,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
    )
    pending = sorted(enumerate(requests), key=lambda x: x[1][0])
    delivered: dict[str, list[int]] = {}
    finished: set[str] = set()
    step = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            i, (_, prompt_len, out_len, prio) = pending.pop(0)
            req = Request(
                request_id=f"q{i}",
                prompt_token_ids=[(i + j) % 50 + 1 for j in range(prompt_len)],
                sampling_params=SamplingParams(max_tokens=out_len, ignore_eos=True),
                max_tokens=out_len,
                priority=prio,
                tenant=f"t{prio}" if prio else None,
            )
            s.add_request(req)
        plan, outs = run_step(s, token=step % 40 + 1)
        assert plan.total_num_scheduled_tokens <= budget
        assert len(plan.scheduled) <= max_num_seqs
        assert len(set(map(id, plan.scheduled))) == len(plan.scheduled)
        assert all(n >= 1 for n in plan.num_scheduled_tokens)
        for o in outs:
            assert o.request_id not in finished
            delivered.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                assert o.finish_reason == "length"
                finished.add(o.request_id)
        assert_kv_accounting(s, block_size)
        step += 1
        assert step < 5_000, "requests did not finish"
    for i, (_, _, out_len, _) in enumerate(requests):
        assert len(delivered[f"q{i}"]) == out_len, "lost or extra tokens"
    assert finished == {f"q{i}" for i in range(len(requests))}
    assert s.kv_cache_manager.num_free_blocks() == num_blocks
