"""The capacity search on scripted probes (no network): ramp, bisection, budget."""

from __future__ import annotations

import pytest

from paternoster.bench.capacity import Objectives, SearchPlan, find_capacity

OBJ = Objectives(ttft_p95=1.0, itl_p95=0.1)


def _summary(ttft_p95: float, itl_p95: float = 0.05, sent: int = 20, errors: int = 0) -> dict:
    return {
        "num_sent": sent, "num_completed": sent - errors, "num_errors": errors,
        "num_not_sent": 0, "error_rate": errors / sent,
        "ttft": {"p95": ttft_p95}, "itl": {"p95": itl_p95},
        "request_throughput": 1.0, "output_throughput": 10.0,
    }  # fmt: skip


def threshold_probe(capacity: float, log: list | None = None):
    """p95 TTFT 0.5 s up to ``capacity``, 5 s above."""

    def probe(load, time_left, req_left):
        if log is not None:
            log.append(load)
        return _summary(0.5 if load <= capacity else 5.0), False

    return probe


def test_ramp_then_bisect_brackets_the_capacity():
    loads: list[float] = []
    plan = SearchPlan("rate", start=1.0, factor=2.0, bisect_rounds=10, tolerance=0.02)
    res = find_capacity(plan, OBJ, threshold_probe(5.3, loads))
    assert loads[:4] == [1, 2, 4, 8]
    assert res.capacity <= 5.3 < res.first_fail
    assert res.first_fail - res.capacity <= 0.02 * res.first_fail
    assert res.stopped == "converged"
    assert [p.phase for p in res.probes][:4] == ["ramp"] * 4
    assert all(p.ok == (p.load <= 5.3) for p in res.probes)


def test_bisection_rounds_are_bounded():
    res = find_capacity(SearchPlan(start=1, bisect_rounds=2), OBJ, threshold_probe(5.3))
    assert len(res.probes) == 4 + 2
    assert 4 <= res.capacity <= 5.3 < res.first_fail <= 8


def test_concurrency_mode_finds_the_integer_capacity():
    plan = SearchPlan("concurrency", start=1, bisect_rounds=10)
    res = find_capacity(plan, OBJ, threshold_probe(11))
    assert (res.capacity, res.first_fail) == (11, 12)
    assert all(p.load == int(p.load) for p in res.probes)


def test_a_failing_start_ramps_down():
    res = find_capacity(SearchPlan(start=16, bisect_rounds=10), OBJ, threshold_probe(3.1))
    assert [p.phase for p in res.probes][:4] == ["ramp", "down", "down", "down"]
    assert res.capacity <= 3.1 < res.first_fail


def test_nothing_passes_above_the_minimum_load():
    res = find_capacity(SearchPlan(start=4, min_load=1), OBJ, threshold_probe(0.1))
    assert res.capacity is None and res.stopped == "min_load"
    assert [p.load for p in res.probes] == [4, 2, 1]


def test_errors_and_itl_fail_a_probe():
    assert not OBJ.judge(_summary(0.1, errors=1))[0]
    assert Objectives(1.0, 0.1, max_error_rate=0.1).judge(_summary(0.1, errors=1))[0]
    ok, why = OBJ.judge(_summary(0.1, itl_p95=0.2))
    assert not ok and "ITL" in why
    assert not OBJ.judge(_summary(0.1, sent=3, errors=3))[0]


def test_max_load_stops_the_ramp():
    res = find_capacity(SearchPlan(start=1, max_load=6), OBJ, threshold_probe(100))
    assert [p.load for p in res.probes] == [1, 2, 4, 6]
    assert res.capacity == 6 and res.stopped == "max_load"


def test_the_request_budget_bounds_the_search():
    res = find_capacity(SearchPlan(start=1), OBJ, threshold_probe(1e9), max_requests=70)
    assert sum(p.summary["num_sent"] for p in res.probes) <= 80
    assert res.stopped == "max_requests" and res.capacity == 8


def test_the_time_budget_bounds_the_search_and_a_cut_probe_is_inconclusive():
    now = [0.0]

    def probe(load, time_left, req_left):
        now[0] += min(10.0, time_left)  # each probe takes 10 s, or what is left
        return _summary(0.5), time_left < 10.0

    res = find_capacity(SearchPlan(start=1), OBJ, probe, max_duration=35, clock=lambda: now[0])
    assert [p.ok for p in res.probes] == [True, True, True, None]
    assert res.capacity == 4 and res.stopped == "max_duration"
    assert res.elapsed == pytest.approx(35)


def test_plan_validation():
    with pytest.raises(ValueError, match="factor"):
        SearchPlan(factor=1)
    with pytest.raises(ValueError, match="integer"):
        SearchPlan("concurrency", start=1.5)
    with pytest.raises(ValueError, match="itl_p95"):
        Objectives(1.0, 0)


def test_a_probe_cut_by_time_with_a_large_request_budget_says_max_duration():
    """Both budgets set (as `bench capacity` always sets --max-requests): the one
    nearly spent is the reason, not the one with thousands of requests left."""
    now = [0.0]

    def probe(load, time_left, req_left):
        now[0] += min(10.0, time_left) - 0.5  # stops a little before the budget
        return _summary(0.5), time_left < 10.0

    res = find_capacity(SearchPlan(start=1), OBJ, probe, max_duration=35, max_requests=2000,
                        clock=lambda: now[0])
    assert res.probes[-1].ok is None and res.stopped == "max_duration"
