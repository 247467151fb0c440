"""FCFS policy and the Scheduler base class bookkeeping, without a model."""

from __future__ import annotations

import pytest

from paternoster.request import RequestStatus
from paternoster.scheduling.registry import available_schedulers, load_scheduler_class

from .conftest import create_requests, create_scheduler, run_step


def run_to_completion(scheduler, max_steps: int = 1000):
    plans, outputs = [], []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return plans, outputs
        plan, outs = run_step(scheduler)
        plans.append(plan)
        outputs.extend(outs)
    raise AssertionError("requests did not finish")


def test_whole_prompts_then_decodes_first():
    s = create_scheduler()
    for r in create_requests(3, prompt_len=5):
        s.add_request(r)
    plan, _ = run_step(s)
    assert plan.num_scheduled_tokens == [5, 5, 5]
    s.add_request(create_requests(4, prompt_len=6)[3])
    plan, _ = run_step(s)
    assert [r.request_id for r in plan.scheduled] == ["r0", "r1", "r2", "r3"]
    assert plan.num_scheduled_tokens == [1, 1, 1, 6]


def test_limits_never_exceeded():
    s = create_scheduler(max_num_seqs=3, max_num_batched_tokens=64, max_model_len=64)
    for r in create_requests(10, prompt_len=20, max_tokens=5):
        s.add_request(r)
    plans, _ = run_to_completion(s)
    for plan in plans:
        assert len(plan.scheduled) <= 3
        assert plan.total_num_scheduled_tokens <= 64


def test_fifo_no_overtaking():
    s = create_scheduler(max_num_batched_tokens=64, max_model_len=64)
    reqs = create_requests(3, prompt_len=30)
    for r in reqs:
        s.add_request(r)
    plan, _ = run_step(s)
    # r0 and r1 fit (60 tokens); r2 must wait even though a decode could run later.
    assert [r.request_id for r in plan.scheduled] == ["r0", "r1"]


def test_max_tokens_finishes_with_length_and_frees_blocks():
    s = create_scheduler(num_blocks=32)
    for r in create_requests(4, prompt_len=7, max_tokens=3):
        s.add_request(r)
    _, outputs = run_to_completion(s)
    finals = [o for o in outputs if o.finished]
    assert len(finals) == 4 and all(o.finish_reason == "length" for o in finals)
    per_req = {}
    for o in outputs:
        per_req.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert all(len(t) == 3 for t in per_req.values())
    assert s.kv_cache_manager.num_free_blocks() == 32


def test_eos_finishes_with_stop_and_no_stop_reason():
    s = create_scheduler()
    (a,) = create_requests(1, max_tokens=10, eos=7)
    s.add_request(a)
    _, outs = run_step(s, token=7)
    assert outs[0].finish_reason == "stop" and outs[0].stop_reason is None


def test_ignore_eos_keeps_generating_past_eos():
    s = create_scheduler()
    (a,) = create_requests(1, max_tokens=10, eos=7, ignore_eos=True)
    s.add_request(a)
    _, outs = run_step(s, token=7)
    assert outs[0].finish_reason is None and not a.is_finished


def test_stop_token_id_finishes_with_it_as_stop_reason():
    s = create_scheduler()
    (a,) = create_requests(1, max_tokens=10, stop_token_ids=[9])
    s.add_request(a)
    run_step(s, token=7)
    _, outs = run_step(s, token=9)
    assert outs[0].finish_reason == "stop" and outs[0].stop_reason == 9


def test_preemption_keeps_generated_tokens_and_completes():
    # 4 requests of 8 prompt tokens, 12 output tokens each: 20 tokens = 5 blocks of 4
    # each at the end, 20 blocks in all, but only 12 blocks exist.
    s = create_scheduler(num_blocks=12, block_size=4, max_model_len=32, max_num_batched_tokens=32)
    reqs = create_requests(4, prompt_len=8, max_tokens=12)
    for r in reqs:
        s.add_request(r)
    outputs = []
    num_preempted = 0
    while s.has_unfinished_requests():
        running_before = list(s.running)
        plan, outs = run_step(s)
        outputs.extend(outs)
        for victim in plan.preempted:
            # The victim is the most recently admitted running request (the one
            # short of blocks included), reset to recompute from scratch and
            # back at the front of the queue.
            assert victim is running_before[-1]
            running_before.remove(victim)
            assert victim.num_computed_tokens == 0 and victim.output_token_ids
            assert victim.status == RequestStatus.PREEMPTED and s.waiting[0] is victim
            num_preempted += 1
    assert num_preempted > 0 and s.num_preemptions_total == num_preempted
    per_req = {}
    for o in outputs:
        per_req.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert all(len(per_req[r.request_id]) == 12 for r in reqs)
    assert all(r.output_token_ids == per_req[r.request_id] for r in reqs)
    assert s.kv_cache_manager.num_free_blocks() == 12


def test_abort_waiting_running_and_preempted_frees_everything():
    s = create_scheduler(num_blocks=12, block_size=4, max_model_len=32, max_num_batched_tokens=32)
    reqs = create_requests(5, prompt_len=8, max_tokens=12)
    for r in reqs:
        s.add_request(r)
    for _ in range(6):
        run_step(s)
    statuses = {r.status for r in reqs}
    assert RequestStatus.RUNNING in statuses
    aborted = s.abort_requests([r.request_id for r in reqs] + ["unknown"])
    assert {r.status for r in aborted} == {RequestStatus.FINISHED_ABORTED}
    assert not s.has_unfinished_requests()
    assert s.kv_cache_manager.num_free_blocks() == 12
    assert s.abort_requests(["r0"]) == []  # already finished: safe no-op


def test_duplicate_request_id_rejected():
    s = create_scheduler()
    (a,) = create_requests(1)
    s.add_request(a)
    (b,) = create_requests(1)
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(b)


def test_whole_prompt_policy_needs_budget_of_max_model_len():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        create_scheduler(max_num_batched_tokens=16, max_model_len=64)


def test_registry_lists_installed_on_unknown_name():
    assert "fcfs" in available_schedulers()
    with pytest.raises(ValueError, match="fcfs"):
        load_scheduler_class("no-such-policy")
