"""The scheduler contract v2 (docs/schedulers.md): the public building blocks
(admit, preempt, fits, can_allocate/allocate), the victim hook, the waiting
queue hook and the API version check, on small worlds without a model."""

from __future__ import annotations

import pytest

from paternoster.request import RequestStatus
from paternoster.scheduling.output import SchedulerOutput
from paternoster.scheduling.registry import check_api_version, load_scheduler_class
from paternoster.scheduling.request_queue import PriorityRequestQueue
from paternoster.scheduling.scheduler import SCHEDULER_API_VERSION, Scheduler

from .conftest import create_requests, create_scheduler, run_step

BUILT_INS = ["fcfs", "chunked_prefill", "priority", "static", "fair", "slo"]


def test_api_version_is_2():
    assert SCHEDULER_API_VERSION == 2 and Scheduler.api_version == 2


@pytest.mark.parametrize("name", BUILT_INS)
def test_built_in_policy_declares_its_registered_name_and_the_api_version(name):
    cls = load_scheduler_class(name)
    assert cls.name == name and cls.api_version == SCHEDULER_API_VERSION


def test_registry_refuses_a_policy_written_for_version_1():
    class OldPolicy(Scheduler):
        api_version = 1

    with pytest.raises(ValueError, match="API version 1.*version 2"):
        check_api_version(OldPolicy, "old")


def test_policy_that_does_not_set_api_version_is_accepted():
    class Plain(Scheduler):
        pass

    check_api_version(Plain, "plain")


def test_fits_is_false_when_every_sequence_slot_is_taken():
    s = create_scheduler(max_num_seqs=1)
    a, b = create_requests(2)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    assert not s.fits(b)


def test_fits_reserves_the_blocks_running_prompts_still_need():
    # 10 blocks of 4: "long" (32 tokens = 8 blocks) has computed 8 tokens
    # (2 blocks); the 6 blocks it still needs are reserved, 2 stay free.
    s = create_scheduler(
        "chunked_prefill", num_blocks=10, max_num_batched_tokens=8, max_model_len=64
    )
    long, small, tiny = create_requests(3, prompt_len=32)
    small.prompt_token_ids = small.prompt_token_ids[:12]  # 3 blocks
    tiny.prompt_token_ids = tiny.prompt_token_ids[:8]  # 2 blocks
    s.add_request(long)
    run_step(s)
    s.add_request(small)
    s.add_request(tiny)
    assert s.kv_cache_manager.num_free_blocks() == 8
    assert not s.fits(small)
    assert s.fits(tiny)


def test_can_allocate_answers_without_allocating():
    s = create_scheduler(num_blocks=4)
    (a,) = create_requests(1, prompt_len=16)
    s.add_request(a)
    assert s.can_allocate(a, 16) and not s.can_allocate(a, 17)
    assert s.kv_cache_manager.num_free_blocks() == 4


def test_admit_moves_a_waiting_request_to_running_with_its_tokens():
    s = create_scheduler()
    (a,) = create_requests(1, prompt_len=6)
    s.add_request(a)
    out = SchedulerOutput()
    assert s.admit(a, out, budget=64) == 6
    assert a.status == RequestStatus.RUNNING and s.running == [a] and not s.waiting
    assert out.scheduled == [a] and out.num_scheduled_tokens == [6]


def test_admit_without_a_free_slot_returns_0_and_changes_nothing():
    s = create_scheduler(max_num_seqs=1)
    a, b = create_requests(2)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    free = s.kv_cache_manager.num_free_blocks()
    out = SchedulerOutput()
    assert s.admit(b, out, budget=64) == 0
    assert b in s.waiting and b.status == RequestStatus.WAITING and out.is_empty
    assert s.kv_cache_manager.num_free_blocks() == free


def test_admit_refuses_a_request_that_is_not_waiting():
    s = create_scheduler()
    (a,) = create_requests(1)
    s.add_request(a)
    run_step(s)
    with pytest.raises(ValueError, match="not waiting"):
        s.admit(a, SchedulerOutput(), budget=64)


def test_preempt_frees_blocks_requeues_and_gives_back_scheduled_tokens():
    s = create_scheduler(num_blocks=16)
    (a,) = create_requests(1, prompt_len=6, max_tokens=8)
    s.add_request(a)
    run_step(s)
    out = s.schedule()
    assert out.num_scheduled_tokens == [1]
    assert s.preempt(a, out) == 1
    assert out.is_empty and out.preempted == [a]
    assert a.status == RequestStatus.PREEMPTED and a.num_computed_tokens == 0
    assert a.output_token_ids == [7] and s.waiting.peek_request() is a
    assert s.kv_cache_manager.num_free_blocks() == 16 and s.num_preemptions_total == 1


def test_preempt_refuses_a_request_that_is_not_running():
    s = create_scheduler()
    (a,) = create_requests(1)
    s.add_request(a)
    with pytest.raises(ValueError, match="not RUNNING"):
        s.preempt(a, SchedulerOutput())


def test_newest_request_short_of_blocks_preempts_itself_under_fcfs():
    # 5 blocks of 4: "old" and "new" hold 2 full blocks each after their 8-token
    # prompts and both need a third for their first decode. "old" goes first and
    # takes the last free block; "new", the newest running request, is the victim
    # of its own shortage (vLLM v1), not "old".
    s = create_scheduler(num_blocks=5, max_num_batched_tokens=64)
    old, new = create_requests(2, prompt_len=8, max_tokens=4)
    s.add_request(old)
    s.add_request(new)
    run_step(s)
    plan, _ = run_step(s)
    assert plan.preempted == [new] and plan.scheduled == [old]


def test_select_victim_sees_every_running_request_including_the_one_short_of_blocks():
    seen = []

    class Recorder(Scheduler):
        name = "recorder"

        def select_victim(self, running):
            seen.append([r.request_id for r in running])
            return super().select_victim(running)

    s = create_scheduler(num_blocks=5)
    s = Recorder(s.config, s.kv_cache_manager, s.batch_builder, s.max_model_len)
    for r in create_requests(2, prompt_len=8, max_tokens=4):
        s.add_request(r)
    run_step(s)
    run_step(s)
    assert seen == [["r0", "r1"]]


def test_a_policy_orders_waiting_by_choosing_its_queue():
    class LongestPromptFirst(Scheduler):
        name = "longest_prompt_first"

        def create_waiting_queue(self):
            return PriorityRequestQueue(key=lambda r: -r.num_prompt_tokens)

    base = create_scheduler(max_num_seqs=1)
    s = LongestPromptFirst(base.config, base.kv_cache_manager, base.batch_builder, 64)
    for r, n in zip(create_requests(3, prompt_len=30, max_tokens=1), [5, 30, 12]):
        r.prompt_token_ids = r.prompt_token_ids[:n]
        s.add_request(r)
    order = [run_step(s)[0].scheduled[0].request_id for _ in range(3)]
    assert order == ["r1", "r2", "r0"]


def test_reject_finishes_a_waiting_request_with_an_error_and_frees_it():
    s = create_scheduler(max_num_seqs=1)
    a, b = create_requests(2)
    s.add_request(a)
    s.add_request(b)
    run_step(s)  # a runs, b waits (one slot)
    out = SchedulerOutput()
    s.reject(b, out, "too late")
    assert out.rejected == [(b, "too late")]
    assert b.status == RequestStatus.FINISHED_ERROR and b.finish_reason == "error"
    assert b.request_id not in s.requests and b not in s.waiting
    with pytest.raises(ValueError, match="not waiting"):
        s.reject(a, out, "running")


def test_on_step_time_is_an_optional_hook_and_the_clock_defaults_to_monotonic():
    import time

    s = create_scheduler()
    plan, _ = run_step(s)
    assert s.on_step_time(plan, 0.01) is None
    assert s.clock is time.monotonic

