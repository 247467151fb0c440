"""The waiting queues: FIFO (a deque) and the priority heap, behind RequestQueue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    RequestQueue,
)


def req(rid: str, priority: int = 0, arrival: float = 0.0) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=1),
        priority=priority,
        arrival_time=arrival,
    )


def ids(queue: RequestQueue) -> list[str]:
    return [r.request_id for r in queue]


@pytest.mark.parametrize("cls", [FCFSRequestQueue, PriorityRequestQueue])
def test_empty_queue_peek_and_pop_raise_index_error(cls):
    q = cls()
    assert not q and len(q) == 0
    with pytest.raises(IndexError):
        q.peek_request()
    with pytest.raises(IndexError):
        q.pop_request()


def test_fifo_pops_in_arrival_order_and_prepended_first():
    q = FCFSRequestQueue()
    for rid in ["a", "b", "c"]:
        q.add_request(req(rid))
    q.prepend_request(req("preempted"))
    assert [q.pop_request().request_id for _ in range(4)] == ["preempted", "a", "b", "c"]


def test_fifo_is_a_deque_so_a_policy_can_insert_at_a_position():
    q = FCFSRequestQueue()
    q.add_request(req("a"))
    q.add_request(req("c"))
    q.insert(1, req("b"))
    assert ids(q) == ["a", "b", "c"]


def test_fifo_remove_takes_a_request_from_the_middle():
    q = FCFSRequestQueue()
    a, b, c = req("a"), req("b"), req("c")
    for r in (a, b, c):
        q.add_request(r)
    q.remove_request(b)
    assert ids(q) == ["a", "c"] and b not in q


def test_heap_pops_lower_priority_value_first_ties_by_arrival():
    q = PriorityRequestQueue()
    q.add_request(req("late-0", priority=0, arrival=2.0))
    q.add_request(req("p5", priority=5, arrival=0.0))
    q.add_request(req("early-0", priority=0, arrival=1.0))
    assert [q.pop_request().request_id for _ in range(3)] == ["early-0", "late-0", "p5"]


def test_heap_prepend_is_placed_by_key_not_at_the_front():
    q = PriorityRequestQueue()
    q.add_request(req("high", priority=0))
    q.prepend_request(req("preempted-low", priority=9))
    assert q.peek_request().request_id == "high"


def test_heap_computes_each_key_once():
    calls = []

    def key(r: Request) -> tuple[int, float]:
        calls.append(r.request_id)
        return (r.priority, r.arrival_time)

    q = PriorityRequestQueue(key=key)
    for i in range(5):
        q.add_request(req(f"r{i}", priority=5 - i))
    for _ in range(3):
        q.peek_request()
    q.pop_request()
    assert sorted(calls) == [f"r{i}" for i in range(5)]


def test_heap_iterates_in_pop_order_without_consuming():
    q = PriorityRequestQueue()
    for rid, p in [("c", 3), ("a", 1), ("b", 2)]:
        q.add_request(req(rid, priority=p))
    assert ids(q) == ["a", "b", "c"]
    assert len(q) == 3 and q.peek_request().request_id == "a"


def test_heap_removed_request_is_never_popped():
    q = PriorityRequestQueue()
    a, b, c = req("a", 1), req("b", 2), req("c", 3)
    for r in (a, b, c):
        q.add_request(r)
    q.remove_request(b)
    assert b not in q and len(q) == 2
    assert [q.pop_request().request_id for _ in range(2)] == ["a", "c"]


def test_heap_remove_of_an_absent_request_raises():
    q = PriorityRequestQueue()
    q.add_request(req("a"))
    with pytest.raises(ValueError, match="not queued"):
        q.remove_request(req("other"))


def test_heap_refuses_a_request_id_already_queued():
    q = PriorityRequestQueue()
    q.add_request(req("a"))
    with pytest.raises(ValueError, match="already queued"):
        q.add_request(req("a", priority=3))


def test_heap_request_can_be_queued_again_after_removal():
    q = PriorityRequestQueue()
    a = req("a", priority=4)
    q.add_request(a)
    q.add_request(req("b", priority=5))
    q.remove_request(a)
    q.add_request(a)
    assert ids(q) == ["a", "b"]


ops = st.lists(
    st.tuples(st.sampled_from(["add", "pop", "remove"]), st.integers(0, 3), st.integers(0, 30)),
    max_size=200,
)


@given(ops)
def test_heap_matches_a_sorted_list_under_any_operations(operations):
    """Adds, pops and removes in any order (tombstones and rebuilds included):
    the heap always holds and yields what a sorted list would."""
    q = PriorityRequestQueue()
    model: list[tuple[int, float, str]] = []
    objects: dict[str, Request] = {}
    for n, (op, priority, pick) in enumerate(operations):
        if op == "add":
            r = req(f"r{n}", priority=priority, arrival=float(n))
            objects[r.request_id] = r
            q.add_request(r)
            model.append((priority, float(n), r.request_id))
        elif op == "pop" and model:
            model.sort()
            assert q.pop_request().request_id == model.pop(0)[2]
        elif op == "remove" and model:
            victim = model.pop(pick % len(model))
            q.remove_request(objects[victim[2]])
        assert len(q) == len(model)
        assert ids(q) == [rid for *_, rid in sorted(model)]
