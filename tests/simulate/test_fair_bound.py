"""The ``fair`` policy keeps the service difference between backlogged tenants
within the bound of Sheng et al., "Fairness in Serving Large Language Models"
(OSDI'24): ``|W_f(t1, t2) - W_g(t1, t2)| <= 2 * U``,
``U = max(w_p * L_input, w_q * M)`` for tenants ``f``, ``g`` backlogged
throughout ``[t1, t2)`` (``L_input``: the longest prompt; ``M``: the tokens a
running batch can hold, the KV cache). ``fcfs`` breaks it on the same traces:
the light tenant is starved while both wait.

The reference is independent of the policy: it replays the simulator's
per-step records (which trace request computed how many tokens, prefill or
decode; who was preempted) against the trace's arrival times, derives which
tenants had a waiting request before and after each step's planning, and sums
each tenant's service ``w_p * prefill tokens + w_q * decode tokens`` per step.
The policy's own counters are never read. The KV cache is small (1024 tokens
for requests of up to 384), so runs preempt tens of times. Observed on these
traces: ``fair`` stays within 0.1-0.3 of the bound, ``fcfs`` exceeds it 4-5x.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from paternoster.simulate import TraceRequest, simulate

LIMITS = dict(num_kv_blocks=64, block_size=16, max_num_seqs=32, max_model_len=512)  # M = 1024
M = LIMITS["num_kv_blocks"] * LIMITS["block_size"]


def burst_trace(seed: int = 0) -> list[TraceRequest]:
    """Everything at t = 0: a flood of 60 requests from "heavy" listed first,
    then 15 from "light" and 15 from "mid" (arrival order favours the flood)."""
    rng = np.random.default_rng(seed)
    trace = []
    for tenant, n in (("heavy", 60), ("light", 15), ("mid", 15)):
        for _ in range(n):
            trace.append(TraceRequest(0.0, int(rng.integers(32, 257)), int(rng.integers(16, 129)),
                                      request_id=f"{tenant}{len(trace)}", tenant=tenant))
    return trace


def poisson_trace(seed: int = 1, rate: float = 0.5, seconds: float = 40.0) -> list[TraceRequest]:
    """Poisson arrivals above capacity: "heavy" at 4x the rate of "light"
    (and of the anonymous tenant ``None``)."""
    rng = np.random.default_rng(seed)
    trace = []
    for tenant, r in (("heavy", 4 * rate), ("light", rate), (None, rate)):
        t = 0.0
        while (t := t + rng.exponential(1 / r)) < seconds:
            trace.append(TraceRequest(round(t, 6), int(rng.integers(32, 257)),
                                      int(rng.integers(16, 129)), tenant=tenant))  # fmt: skip
    trace.sort(key=lambda x: x.arrival_time)
    return trace


def per_step_service(result, trace, w_p: float, w_q: float):
    """For each simulated step: the tenants backlogged through its planning
    (a waiting request before and after it), and each tenant's service in it."""
    state = ["future"] * len(trace)  # -> waiting -> running (<-> waiting on preemption)
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_time)
    nxt = 0
    out = []
    for step in result.steps:
        while nxt < len(order) and trace[order[nxt]].arrival_time <= step.start:
            state[order[nxt]] = "waiting"
            nxt += 1
        before = {trace[i].tenant for i, s in enumerate(state) if s == "waiting"}
        for i in step.preempted:
            assert state[i] == "running"
            state[i] = "waiting"
        service: dict = defaultdict(float)
        for i, num_tokens, kind in step.rows:
            assert state[i] != "future", "a request ran before it arrived"
            state[i] = "running"
            service[trace[i].tenant] += (w_p if kind == "prefill" else w_q) * num_tokens
        after = {trace[i].tenant for i, s in enumerate(state) if s == "waiting"}
        out.append((before & after, service))
    return out


def worst_gap(steps, f, g) -> tuple[float, int]:
    """The largest ``|W_f - W_g|`` over runs of consecutive steps in which both
    ``f`` and ``g`` are backlogged throughout, and the steps they shared."""
    worst, shared, lo, hi, d = 0.0, 0, None, None, 0.0
    for backlogged, service in steps:
        if f in backlogged and g in backlogged:
            if lo is None:
                lo = hi = d = 0.0
            d += service[f] - service[g]
            lo, hi = min(lo, d), max(hi, d)
            worst = max(worst, hi - lo)
            shared += 1
        else:
            lo = None
    return worst, shared


def check(trace, policy: str, options: dict, budget: int) -> tuple[float, float, int, int]:
    """Run ``trace``; return (worst gap over every pair of tenants, 2U, the fewest
    steps a pair shared backlogged, preemptions)."""
    w_p = options.get("input_token_weight", 1.0)
    w_q = options.get("output_token_weight", 2.0)
    result = simulate(trace, policy, options, max_num_batched_tokens=budget, **LIMITS)
    steps = per_step_service(result, trace, w_p, w_q)
    bound = 2 * max(w_p * max(t.prompt_len for t in trace), w_q * M)
    tenants = sorted({t.tenant for t in trace}, key=str)
    gaps = [worst_gap(steps, f, g) for f, g in itertools.combinations(tenants, 2)]
    return max(g for g, _ in gaps), bound, min(n for _, n in gaps), result.num_preemptions_total


@pytest.mark.parametrize("budget", [64, 512])
@pytest.mark.parametrize("options", [{}, {"input_token_weight": 1, "output_token_weight": 1}])
@pytest.mark.parametrize("make_trace", [burst_trace, poisson_trace])
def test_fair_keeps_backlogged_tenants_within_the_papers_bound(make_trace, options, budget):
    gap, bound, shared, preemptions = check(make_trace(), "fair", options, budget)
    assert shared >= 50, "the trace must keep every pair of tenants backlogged together"
    assert preemptions > 0, "the small KV cache should make the engine preempt"
    assert gap <= bound, f"service gap {gap} exceeds 2U = {bound}"


@pytest.mark.parametrize("make_trace", [burst_trace, poisson_trace])
def test_fcfs_starves_the_light_tenant_on_the_same_traces(make_trace):
    """The check can fail: first come, first served lets the flood take the
    engine while the light tenant waits, far beyond the bound."""
    gap, bound, shared, _ = check(make_trace(), "fcfs", {}, 512)
    assert shared >= 50
    assert gap > 2 * bound, f"fcfs gap {gap} vs 2U = {bound}"
