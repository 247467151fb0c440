"""priority policy: ordering, preemption of the lowest priority, aging (no model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paternoster.request import RequestStatus
from paternoster.scheduling.registry import load_scheduler_class
from paternoster.scheduling.request_queue import PriorityRequestQueue

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


def test_without_aging_a_stream_of_high_priority_starves_a_low_one():
    assert not _starvation_run(aging_steps=0)


def test_aging_lets_low_priority_finish_under_a_stream_of_high_priority():
    assert _starvation_run(aging_steps=5)


def test_equal_priority_is_admitted_in_arrival_order():
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=0)
    reqs = create_requests(3, max_tokens=1)
    for i, r in enumerate(reqs):
        r.arrival_time = 10.0 - i  # r2 arrived first
        s.add_request(_with_priority(r, 1, f"arrived{2 - i}"))
    order = [run_step(s)[0].scheduled[0].request_id for _ in range(3)]
    assert order == ["arrived0", "arrived1", "arrived2"]


def test_aging_orders_waiting_by_priority_times_aging_steps_plus_step_queued():
    # aging_steps=2: priority 3 queued at step 0 ranks like priority 0 queued at
    # step 6 (a tie, broken by arrival); a blocker far ahead holds the only slot.
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=2)
    blocker, old, before, tie, after = create_requests(5, max_tokens=30)
    for r, t in zip((blocker, old, before, tie, after), range(5)):
        r.arrival_time = float(t)
    s.add_request(_with_priority(blocker, -100, "blocker"))
    s.add_request(_with_priority(old, 3, "old"))
    for r, name, steps in ((before, "before", 5), (tie, "tie", 6), (after, "after", 7)):
        while s.num_steps < steps:
            run_step(s)
        s.add_request(_with_priority(r, 0, name))
    assert [r.request_id for r in s.running] == ["blocker"]
    assert [r.request_id for r in s.waiting] == ["before", "old", "tie", "after"]


def test_kv_shortage_preempts_the_lowest_priority_running_request_not_the_newest():
    # 5 blocks of 4. "low" (8-token prompt) runs first and grows to 3 blocks;
    # "high" arrives and takes the other 2. At high's first decode no block is
    # free: the victim is "low" (worst rank), though "high" is the newest.
    s = create_scheduler("priority", num_blocks=5, aging_steps=0)
    low, high = create_requests(2, prompt_len=8, max_tokens=6)
    s.add_request(_with_priority(low, 5, "low"))
    run_step(s)
    s.add_request(_with_priority(high, 0, "high"))
    run_step(s)
    assert [r.request_id for r in s.running] == ["low", "high"]
    plan, _ = run_step(s)
    assert plan.preempted == [low] and plan.scheduled == [high]


def test_waiting_heap_computes_each_key_once_per_enqueue():
    """No per-step re-sort: a key is computed when a request is queued (new or
    preempted) and never again while it waits."""
    keys: list[str] = []
    cls = load_scheduler_class("priority")

    class Counting(cls):
        def create_waiting_queue(self):
            queue = super().create_waiting_queue()
            inner = queue._key

            def key(request):
                keys.append(request.request_id)
                return inner(request)

            return PriorityRequestQueue(key=key)

    base = create_scheduler("priority", max_num_seqs=1)
    s = Counting(base.config, base.kv_cache_manager, base.batch_builder, base.max_model_len)
    for i, r in enumerate(create_requests(4, max_tokens=3)):
        s.add_request(_with_priority(r, i, f"p{i}"))
    while s.has_unfinished_requests():
        run_step(s)
    assert sorted(keys) == ["p0", "p1", "p2", "p3"] and s.num_steps >= 12


def _add_arrivals(s, pending: list, max_tokens: int) -> None:
    """Queue the ``pending`` ``(index, (step, priority))`` arrivals due by now
    (``pending`` sorted by step; consumed)."""
    while pending and pending[0][1][0] <= s.num_steps:
        i, (_, prio) = pending.pop(0)
        (r,) = create_requests(1, prompt_len=6, max_tokens=max_tokens)
        r.arrival_time = float(i)
        s.add_request(_with_priority(r, prio, f"q{i}"))


@settings(max_examples=30, deadline=None)
@given(
    arrivals=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 4)), min_size=1, max_size=12),
    aging_steps=st.integers(0, 4),
)
def test_heap_order_is_always_the_order_of_current_rank_then_arrival(arrivals, aging_steps):
    """The fixed heap key keeps waiting requests in the order of their rank at
    every step (priority * aging_steps - steps waited), ties by arrival."""
    s = create_scheduler("priority", max_num_seqs=2, num_blocks=20, aging_steps=aging_steps)
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    while pending or s.has_unfinished_requests():
        _add_arrivals(s, pending, max_tokens=3)
        waiting = list(s.waiting)
        assert waiting == sorted(waiting, key=lambda r: (s.rank(r), r.arrival_time))
        run_step(s)
        assert s.num_steps < 500


# ------------------------------------------------- no ping-pong (issue 37)


def _long_then_urgent_then_equals(n_long: int, m_late: int, aging_steps: int):
    """``n_long`` long requests of priority 1 fill every sequence slot; an
    urgent one (priority 0) arrives, then ``m_late`` more of priority 1.
    Returns the scheduler, the requests by name, and each one's first-token step."""
    s = create_scheduler("priority", num_blocks=512, block_size=16, max_num_seqs=n_long,
                         max_num_batched_tokens=256, max_model_len=256,
                         aging_steps=aging_steps)
    reqs = {}
    for i, r in enumerate(create_requests(n_long, prompt_len=8, max_tokens=120)):
        reqs[f"long{i}"] = _with_priority(r, 1, f"long{i}")
        r.arrival_time = float(i)
        s.add_request(r)
    for _ in range(4):
        run_step(s)
    (urgent,) = create_requests(1, prompt_len=8, max_tokens=10)
    urgent.arrival_time = 100.0
    reqs["urgent"] = _with_priority(urgent, 0, "urgent")
    s.add_request(urgent)
    first: dict[str, int] = {}
    arrivals = iter(range(m_late))
    while s.has_unfinished_requests():
        j = next(arrivals, None)
        if j is not None:  # one equal-priority arrival per step
            (late,) = create_requests(1, prompt_len=8, max_tokens=10)
            late.arrival_time = 200.0 + j
            reqs[f"late{j}"] = _with_priority(late, 1, f"late{j}")
            s.add_request(late)
        _, outputs = run_step(s)
        for o in outputs:
            first.setdefault(o.request_id, s.num_steps)
        assert s.num_steps < 2000
    return s, reqs, first


@pytest.mark.parametrize("aging_steps", [0, 1, 100])
@pytest.mark.parametrize(("n_long", "m_late"), [(2, 1), (1, 3), (4, 5)])
def test_an_urgent_arrival_among_long_equals_costs_one_preemption(n_long, m_late, aging_steps):
    """The scenario of issue 37 (68 preemptions with continuous aging): one
    preemption makes room for the urgent request, served at once; the
    equal-priority newcomers wait for a long request to finish instead of
    displacing it, and nothing is preempted twice."""
    s, reqs, first = _long_then_urgent_then_equals(n_long, m_late, aging_steps)
    assert s.num_preemptions_total == 1
    assert max(r.num_preemptions for r in reqs.values()) == 1
    assert reqs[f"long{n_long - 1}"].num_preemptions == 1  # the latest arrival
    assert first["urgent"] == 5  # the step after it arrived
    longs_done = sorted(first[f"long{i}"] for i in range(n_long))
    assert all(first[f"late{j}"] > longs_done[0] for j in range(m_late))
    assert all(len(r.output_token_ids) == r.max_tokens for r in reqs.values())


def test_a_preempted_request_keeps_what_it_aged():
    """``low`` waits 20 steps behind a blocker, runs, and is displaced by an
    urgent request; queued again, it goes before ``equal``, an equal-priority
    request that waited less (with its age reset it would go after)."""
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=10)
    blocker, low, equal, urgent = create_requests(4, max_tokens=20)
    s.add_request(_with_priority(blocker, 0, "blocker"))
    s.add_request(_with_priority(low, 1, "low"))
    while not blocker.is_finished:
        if s.num_steps == 12:
            s.add_request(_with_priority(equal, 1, "equal"))
        run_step(s)
    run_step(s)
    assert s.running == [low]
    s.add_request(_with_priority(urgent, -5, "urgent"))
    plan, _ = run_step(s)
    assert plan.preempted == [low] and s.running == [urgent]
    assert [r.request_id for r in s.waiting] == ["low", "equal"]
    while not urgent.is_finished:
        run_step(s)
    run_step(s)
    assert s.running == [low] and low.num_preemptions == 1


def test_an_urgent_arrival_displaces_running_requests_that_aged_while_queued():
    """Trial finding (issue 37): with displacement gated on rank, requests
    that queued ~6 s before they ran held off a priority-0 arrival for 3.6 s.
    Aging orders the queue; it does not shield a running request."""
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=2)
    blocker, low, urgent = create_requests(3, max_tokens=8)
    s.add_request(_with_priority(blocker, -10, "blocker"))
    s.add_request(_with_priority(low, 1, "low"))
    while not blocker.is_finished:
        run_step(s)
    run_step(s)
    assert s.running == [low] and s.rank(low) < 0  # aged past priority 0
    s.add_request(_with_priority(urgent, 0, "urgent"))
    plan, _ = run_step(s)
    assert plan.preempted == [low] and s.running == [urgent]


def test_a_request_is_displaced_at_most_once():
    """``low`` is displaced by a first urgent request; back in a slot, a
    second urgent one waits for it instead of displacing it again."""
    s = create_scheduler("priority", max_num_seqs=1, aging_steps=0)
    low, urgent1, urgent2 = create_requests(3, max_tokens=6)
    s.add_request(_with_priority(low, 5, "low"))
    run_step(s)
    s.add_request(_with_priority(urgent1, 0, "urgent1"))
    plan, _ = run_step(s)
    assert plan.preempted == [low]
    while not urgent1.is_finished:
        run_step(s)
    run_step(s)
    assert s.running == [low]
    s.add_request(_with_priority(urgent2, 0, "urgent2"))
    while s.has_unfinished_requests():
        plan, _ = run_step(s)
        assert not plan.preempted
    assert low.num_preemptions == 1 and s.num_preemptions_total == 1
    assert urgent2.is_finished and len(low.output_token_ids) == 6


@settings(max_examples=40, deadline=None)
@given(
    arrivals=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 3)), min_size=1, max_size=14),
    max_num_seqs=st.integers(1, 3),
    aging_steps=st.integers(0, 6),
)
def test_only_a_strictly_more_urgent_admission_preempts(arrivals, max_num_seqs, aging_steps):
    """With KV to spare, every preemption makes room for a request admitted
    in the same step whose base priority is strictly more urgent (never one
    of its own priority), and no request is preempted twice."""
    s = create_scheduler("priority", max_num_seqs=max_num_seqs, num_blocks=256,
                         aging_steps=aging_steps)
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    while pending or s.has_unfinished_requests():
        _add_arrivals(s, pending, max_tokens=6)
        before = set(map(id, s.running))
        plan, _ = run_step(s)
        admitted = [r for r in plan.scheduled if id(r) not in before]
        for victim in plan.preempted:
            assert any(a.priority < victim.priority for a in admitted)
            assert victim.num_preemptions == 1
        assert s.num_steps < 500
