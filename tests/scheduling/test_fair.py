"""The ``fair`` policy (Virtual Token Counter, Sheng et al., OSDI'24) and its
per-tenant queue on small worlds: the counter lift, the admission order, the
charges, the victim and the options."""

from __future__ import annotations

import pytest

from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.fair_queue import TenantFairQueue

from .conftest import create_scheduler, run_step


def req(rid: str, tenant: str | None, prompt_len: int = 4, max_tokens: int = 4) -> Request:
    return Request(
        request_id=rid, prompt_token_ids=[(hash(rid) + j) % 90 + 3 for j in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        max_tokens=max_tokens, tenant=tenant,
    )  # fmt: skip


# ------------------------------------------------------------------ the queue


def test_queue_serves_the_backlogged_tenant_with_the_smallest_counter():
    q = TenantFairQueue()
    a1, a2, b1 = req("a1", "a"), req("a2", "a"), req("b1", "b")
    for r in (a1, a2, b1):
        q.add_request(r)
    assert q.peek_request() is a1  # both at 0: the one queued first
    q.charge("a", 5)
    assert q.peek_request() is b1
    q.charge("b", 7)
    assert q.peek_request() is a1
    assert list(q) == [a1, a2, b1] and len(q) == 3
    assert q.pop_request() is a1 and q.pop_request() is a2 and q.pop_request() is b1
    assert not q
    with pytest.raises(IndexError):
        q.peek_request()


def test_equal_counters_take_turns():
    q = TenantFairQueue()
    for r in (req("a1", "a"), req("a2", "a"), req("b1", "b"), req("b2", "b")):
        q.add_request(r)
    order = []
    while q:
        r = q.pop_request()
        order.append(r.request_id)
        q.charge(r.tenant, 1)
    assert order == ["a1", "b1", "a2", "b2"]


def test_a_newly_backlogged_tenant_is_lifted_to_the_smallest_backlogged_counter():
    q = TenantFairQueue()
    q.add_request(req("a1", "a"))
    q.add_request(req("b1", "b"))
    q.charge("a", 100)
    q.charge("b", 40)
    q.add_request(req("c1", "c"))  # new: lifted to min(100, 40)
    assert q.counter("c") == 40
    q.charge("c", 1_000)  # c has more than the floor: no lift down
    q.remove_request(q.peek_request())  # b1 leaves; b is no longer backlogged
    q.add_request(req("b2", "b"))  # b returns: max(40, min(a=100, c=1040))
    assert q.counter("b") == 100
    assert q.counter(None) == 0 and q.floor() == 100


def test_when_nobody_is_backlogged_the_lift_is_the_last_tenants_counter():
    q = TenantFairQueue()
    a1 = req("a1", "a")
    q.add_request(a1)
    q.charge("a", 70)
    q.remove_request(a1)
    q.charge("a", 30)  # service while running, after it left the queue
    assert q.floor() == 70
    q.add_request(req("n1", None))  # the anonymous tenant arrives to an empty queue
    assert q.counter(None) == 70


def test_preempted_requests_go_first_among_their_tenants_and_removal_works_anywhere():
    q = TenantFairQueue()
    a1, a2, a3 = req("a1", "a"), req("a2", "a"), req("a3", "a")
    for r in (a1, a2, a3):
        q.add_request(r)
    q.remove_request(a2)
    assert a2 not in q and a1 in q
    q.prepend_request(a2)
    assert list(q) == [a2, a1, a3]
    with pytest.raises(ValueError, match="already queued"):
        q.add_request(a1)
    twin = req("a1", "a")  # same id, another object
    assert twin not in q
    with pytest.raises(ValueError, match="not queued"):
        q.remove_request(twin)


def test_forget_drops_only_idle_counters_at_or_below_the_floor():
    q = TenantFairQueue()
    a1, b1 = req("a1", "a"), req("b1", "b")
    q.add_request(a1)
    q.charge("a", 10)
    q.add_request(b1)  # lifted to 10
    q.charge("b", 50)
    assert not q.forget("a")  # backlogged
    q.remove_request(b1)
    assert q.floor() == 10 and not q.forget("b")  # 60 > 10: kept
    q.charge("a", 100)
    q.remove_request(a1)  # the queue empties: floor = a's 110
    assert q.forget("b") and "b" not in q.counters
    q.add_request(req("b2", "b"))
    assert q.counter("b") == 110  # what it would have been lifted to anyway


def test_many_charges_keep_the_heap_small():
    q = TenantFairQueue()
    q.add_request(req("a1", "a"))
    q.add_request(req("b1", "b"))
    for i in range(10_000):
        q.charge("a" if i % 2 else "b", 1)
    assert len(q._heap) <= 2 * 2 + 64 + 1
    assert q.peek_request().tenant in ("a", "b")


# ----------------------------------------------------------------- the policy


def fair(**kw):
    """A ``fair`` scheduler; keyword arguments: limits and policy options."""
    return create_scheduler("fair", **kw)


def test_charges_are_w_p_per_prefill_token_and_w_q_per_decode_token():
    s = fair(input_token_weight=1, output_token_weight=3)
    s.add_request(req("a1", "a", prompt_len=6, max_tokens=3))
    run_step(s)  # 6 prompt tokens (the first output token is sampled)
    assert s.counter("a") == 6
    run_step(s)  # one decode
    run_step(s)  # another; the request ends with its third token
    assert s.counter("a") == 6 + 3 + 3
    assert not s.has_unfinished_requests()


def service_order(policy: str) -> list[str]:
    """With one sequence slot and one-token answers, the order in which
    ``policy`` serves a0..a3 (tenant "a") then b0, b1 (tenant "b"), queued in
    that order."""
    s = create_scheduler(policy, max_num_seqs=1)
    for rid in ("a0", "a1", "a2", "a3", "b0", "b1"):
        s.add_request(req(rid, rid[0], max_tokens=1))
    order = []
    while s.has_unfinished_requests():
        plan, _ = run_step(s)
        order += [r.request_id for r in plan.scheduled]
    return order


def test_admission_alternates_between_tenants_not_arrival_order():
    assert service_order("fair") == ["a0", "b0", "a1", "b1", "a2", "a3"]
    assert service_order("fcfs") == ["a0", "a1", "a2", "a3", "b0", "b1"]


def test_tenant_weights_give_shares_in_proportion():
    s = fair(max_num_seqs=1, tenant_weights={"gold": 2.0})
    for i in range(6):
        s.add_request(req(f"g{i}", "gold", max_tokens=1))
        s.add_request(req(f"s{i}", "std", max_tokens=1))
    served = []
    for _ in range(6):
        plan, _ = run_step(s)
        served += [r.tenant for r in plan.scheduled]
    assert served.count("gold") == 4 and served.count("std") == 2


def test_the_victim_is_the_latest_request_of_the_tenant_with_the_largest_counter():
    s = fair()
    a1, b1, a2, b2 = req("a1", "a"), req("b1", "b"), req("a2", "a"), req("b2", "b")
    for r in (a1, b1, a2, b2):
        s.add_request(r)
    run_step(s)
    assert [r.request_id for r in s.running] == ["a1", "b1", "a2", "b2"]
    s.fair_queue.charge("a", 1)
    assert s.select_victim(s.running) is a2
    s.fair_queue.charge("b", 5)
    assert s.select_victim(s.running) is b2


def test_decodes_run_first_then_prompt_chunks_by_counter():
    s = fair(max_num_batched_tokens=16, long_prefill_token_threshold=4)
    c = req("c", "c", 2, max_tokens=8)
    s.add_request(c)
    run_step(s)  # c prefilled, now decoding
    s.add_request(req("a", "a", 20))
    s.add_request(req("b", "b", 20))
    plan, _ = run_step(s)  # c decodes; a and b admitted with a 4-token chunk each
    assert [r.request_id for r in plan.scheduled] == ["c", "a", "b"]
    s.fair_queue.charge("a", 100)
    plan, _ = run_step(s)
    assert [r.request_id for r in plan.scheduled] == ["c", "b", "a"]
    assert plan.num_scheduled_tokens == [1, 4, 4]


@pytest.mark.parametrize(("options", "match"), [
    ({"input_token_weight": -1}, r"input_token_weight must be a number in \[0, 1000\]"),
    ({"output_token_weight": True}, "output_token_weight must be a number"),
    ({"output_token_weight": float("inf")}, r"output_token_weight must be a number in \[0, 1000\]"),
    ({"output_token_weight": float("nan")}, "output_token_weight must be a number in"),
    ({"input_token_weight": 1e308}, "input_token_weight must be a number in"),
    ({"input_token_weight": 10**400}, "input_token_weight must be a number in"),
    ({"input_token_weight": 0, "output_token_weight": 0}, "must not both be 0"),
    ({"tenant_weights": [1]}, "tenant_weights must be a map"),
    ({"tenant_weights": {"a": 0}}, r'tenant_weights\["a"\] must be a number in \[0.001, 1000\]'),
    ({"tenant_weights": {"a": 1e-310}}, r'tenant_weights\["a"\] must be a number in'),  # 1/w = inf
    ({"tenant_weights": {"a": 1001}}, r'tenant_weights\["a"\] must be a number in'),
    ({"tenant_weights": {"a": "2"}}, r'tenant_weights\["a"\] must be a number in'),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ({"w_q": 2}, "unknown scheduler_config keys for 'fair'"),
])  # fmt: skip
def test_bad_options_are_refused_naming_them(options, match):
    with pytest.raises(ValueError, match=match):
        create_scheduler("fair", **options)


def test_weights_at_the_bounds_are_taken():
    s = create_scheduler("fair", input_token_weight=1000, output_token_weight=0,
                         tenant_weights={"a": 0.001, "b": 1000})  # fmt: skip
    assert s.tenant_weights == {"a": 0.001, "b": 1000.0} and s.input_token_weight == 1000.0
