"""priority policy: ordering, preemption of the lowest priority, aging (no model)."""

from __future__ import annotations

from paternoster.request import RequestStatus

from .conftest import create_requests, create_scheduler, run_step


def _with_priority(req, priority: int, name: str):
    req.priority = priority
    req.request_id = name
    return req


def test_lower_value_is_admitted_first():
    s = create_scheduler("priority", max_num_seqs=1)
    reqs = create_requests(3, max_tokens=2)
    for r, p, name in zip(reqs, [5, 1, 3], ["low", "high", "mid"]):
        s.add_request(_with_priority(r, p, name))
    order = []
    while s.has_unfinished_requests():
        plan, _ = run_step(s)
        for r in plan.scheduled:
            if r.request_id not in order:
                order.append(r.request_id)
    assert order == ["high", "mid", "low"]


def test_high_priority_arrival_preempts_lowest_running_when_slots_are_full():
    s = create_scheduler("priority", max_num_seqs=2, aging_steps=0)
    a, b, c = create_requests(3, max_tokens=10)
    s.add_request(_with_priority(a, 2, "a"))
    s.add_request(_with_priority(b, 5, "b"))
    run_step(s)
    run_step(s)
    s.add_request(_with_priority(c, 0, "c"))
    plan, _ = run_step(s)
    assert [r.request_id for r in plan.preempted] == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.output_token_ids
    assert {r.request_id for r in plan.scheduled} == {"a", "c"}


def test_high_priority_arrival_preempts_when_kv_blocks_are_full():
    # 12 blocks of 4 tokens; two 20-token prompts take 10 blocks.
    s = create_scheduler("priority", num_blocks=12, block_size=4, max_num_seqs=8, aging_steps=0)
    low1, low2, high = create_requests(3, prompt_len=20, max_tokens=6)
    s.add_request(_with_priority(low1, 3, "low1"))
    s.add_request(_with_priority(low2, 4, "low2"))
    run_step(s)
    s.add_request(_with_priority(high, 0, "high"))
    plan, _ = run_step(s)
    assert [r.request_id for r in plan.preempted] == ["low2"]
    assert high in plan.scheduled
    while s.has_unfinished_requests():
        run_step(s)
    assert all(len(r.output_token_ids) == 6 for r in (low1, low2, high))
    assert s.kv_cache_manager.num_free_blocks() == 12


def test_equal_priority_never_preempts():
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=0)
    a, b = create_requests(2, max_tokens=5)
    s.add_request(_with_priority(a, 1, "a"))
    run_step(s)
    s.add_request(_with_priority(b, 1, "b"))
    plan, _ = run_step(s)
    assert not plan.preempted and [r.request_id for r in plan.scheduled] == ["a"]


def _starvation_run(aging_steps: int, steps: int = 200) -> bool:
    """A low-priority request under a steady stream of high-priority ones."""
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=aging_steps)
    first, low = create_requests(2, max_tokens=2)
    s.add_request(_with_priority(first, 0, "first"))
    s.add_request(_with_priority(low, 10, "low"))
    counter = 0
    for _ in range(steps):
        if s.num_waiting < 2:
            (hi,) = create_requests(1, max_tokens=2)
            s.add_request(_with_priority(hi, 0, f"hi{counter}"))
            counter += 1
        run_step(s)
        if low.is_finished:
            return True
    return False


def test_aging_lets_low_priority_finish_under_a_stream_of_high_priority():
    assert not _starvation_run(aging_steps=0)
    assert _starvation_run(aging_steps=5)
