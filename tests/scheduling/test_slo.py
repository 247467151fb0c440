"""The slo policy on hand-checkable worlds.

The cost model is made simple enough to plan by hand: a step costs 10 ms,
2 ms per decode and 1 ms per prompt token (no attention terms). With an ITL
target of 0.1 s (no margin) and three requests decoding, a step has
0.1 - 0.016 = 0.084 s for prompts: 84 tokens per 0.1 s step. Every expected
figure below is worked out from that arithmetic, not from the policy's code.
"""

from __future__ import annotations

import logging

import pytest

import paternoster.schedulers.slo_options as slo_options
from paternoster.request import Request, RequestStatus
from paternoster.sampling_params import SamplingParams

from .conftest import create_scheduler

SIMPLE = {"overhead": 0.01, "a_prefill": 0.001, "a_decode": 0.002, "a_kv": 0.0,
          "a_kv_prefill": 0.0}  # fmt: skip


def make(rid: str, prompt_len: int, max_tokens: int = 4, arrival: float = 0.0,
         **kw) -> Request:  # fmt: skip
    return Request(
        request_id=rid,
        prompt_token_ids=[(hash(rid) + j) % 90 + 3 for j in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        max_tokens=max_tokens, arrival_time=arrival, **kw,
    )  # fmt: skip


def slo(clock=None, caching: bool = False, **options):
    cfg = {"cost_model": SIMPLE, "itl_s": 0.1, "margin": 0.0, "adapt": False, **options}
    s = create_scheduler("slo", num_blocks=512, block_size=16, max_num_seqs=16,
                         max_num_batched_tokens=2048, max_model_len=2048, caching=caching,
                         **cfg)  # fmt: skip
    s.clock = clock or (lambda: 0.0)
    return s


def step(s, seconds: float | None = None):
    """One step as the engine runs it; ``seconds`` is reported to on_step_time."""
    plan = s.schedule()
    plan.batch_arrays()  # built before the step, as EngineCore does
    sampled = {i: 7 for i, (r, n) in enumerate(zip(plan.scheduled, plan.num_scheduled_tokens))
               if r.num_computed_tokens + n == r.num_tokens}  # fmt: skip
    outs = s.update_from_output(plan, sampled)
    if seconds is not None:
        s.on_step_time(plan, seconds)
    return plan, outs


def with_three_decoders(s) -> None:
    """Three short requests: nothing decodes yet, so one step prefills them
    whole; from then on they decode."""
    for i in range(3):
        s.add_request(make(f"d{i}", 10, max_tokens=1000))
    plan, _ = step(s)
    assert plan.num_scheduled_tokens == [10, 10, 10]


def rows(plan) -> dict[str, int]:
    return {r.request_id: n for r, n in zip(plan.scheduled, plan.num_scheduled_tokens)}


def test_budget_is_what_the_decodes_leave_of_the_itl_target():
    s = slo()
    with_three_decoders(s)
    s.add_request(make("long", 500))
    for _ in range(5):  # 500 = 5 * 84 + 80
        plan, _ = step(s)
        assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "long": 84}
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "long": 80}


def test_more_decodes_leave_less_budget():
    s = slo()
    for i in range(10):
        s.add_request(make(f"d{i}", 5, max_tokens=1000))
    step(s)
    s.add_request(make("p", 300))
    plan, _ = step(s)
    assert rows(plan)["p"] == 100 - 10 - 20  # 0.1 s - 10 ms - 10 x 2 ms


def test_chunks_go_in_deadline_order():
    """Deadlines 5 s (a), 1.1 s (b), 3.2 s (c): b, then c, then a, whatever the
    arrival order; 84 tokens a step: b's 40 and c's 40 whole, 4 of a."""
    s = slo()
    with_three_decoders(s)
    s.add_request(make("a", 40, slo_ttft_s=5.0))
    s.add_request(make("b", 40, arrival=0.1, slo_ttft_s=1.0))
    s.add_request(make("c", 40, arrival=0.2, slo_ttft_s=3.0))
    plan, _ = step(s)
    assert [r.request_id for r in plan.scheduled] == ["d0", "d1", "d2", "b", "c", "a"]
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "b": 40, "c": 40, "a": 4}


def test_moore_hodgson_moves_the_request_that_makes_others_late():
    """A prefill of W seconds in k steps ends after k x 16 ms of decodes plus
    W. L (250 tokens, deadline 0.35 s) alone ends at 3 x 0.016 + 0.25 =
    0.298 s, and S1 behind it at 4 x 0.016 + 0.31 = 0.374 <= 0.44 s, but S2
    would end at 5 x 0.016 + 0.37 = 0.45 > 0.44 s: the longest, L, goes late,
    and S1 and S2 both make it (2 x 0.016 + 0.12 = 0.152 s). A step later
    (0.1 s) S1 decodes too (18 ms a step): S2's last 36 tokens, then L."""
    now = [0.0]
    s = slo(clock=lambda: now[0])
    with_three_decoders(s)
    s.add_request(make("L", 250, slo_ttft_s=0.35))
    s.add_request(make("S1", 60, slo_ttft_s=0.44))
    s.add_request(make("S2", 60, slo_ttft_s=0.44))
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "S1": 60, "S2": 24}
    assert s.num_late == 1
    now[0] = 0.1
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "S1": 1, "S2": 36, "L": 100 - 18 - 36}


def test_late_requests_are_deprioritised_not_dropped():
    now = [0.0]
    s = slo(clock=lambda: now[0])
    with_three_decoders(s)
    s.add_request(make("hopeless", 300, max_tokens=2, slo_ttft_s=0.01))
    s.add_request(make("fine", 50, max_tokens=2))
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "fine": 50, "hopeless": 34}
    done = set()
    for _ in range(20):
        now[0] += 0.1
        _, outs = step(s)
        done |= {o.request_id for o in outs if o.finished}
    assert {"fine", "hopeless"} <= done


def test_load_shedding_refuses_a_request_that_cannot_meet_its_target():
    """Whole prompt now: 0.016 + 0.3 s > its 0.2 s target: refused, its KV
    blocks free, and the request that can make it runs."""
    s = slo(load_shedding=True)
    with_three_decoders(s)
    free = s.kv_cache_manager.num_free_blocks()
    s.add_request(make("hopeless", 300, slo_ttft_s=0.2))
    s.add_request(make("fine", 50))
    plan, _ = step(s)
    [(req, reason)] = plan.rejected
    assert req.request_id == "hopeless" and req.status == RequestStatus.FINISHED_ERROR
    assert "TTFT target" in reason and "hopeless" not in s.requests
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "fine": 50}
    assert s.num_shed == 1
    assert s.kv_cache_manager.num_free_blocks() == free - 4  # fine's 50 tokens: 4 blocks


def test_no_shedding_when_the_whole_prompt_still_makes_it():
    s = slo(load_shedding=True)
    with_three_decoders(s)
    s.add_request(make("tight", 300, slo_ttft_s=0.32))  # 0.016 + 0.3 <= 0.32
    plan, _ = step(s)
    assert not plan.rejected and rows(plan)["tight"] == 84


def test_load_shedding_counts_the_cached_prefix_as_computed():
    """A 300-token prompt served once leaves 288 tokens (18 blocks of 16, not
    the last token's) in the prefix cache. The same prompt again under a
    0.2 s target needs 0.016 + 12 x 1 ms: admitted; another 300-token prompt
    needs 0.016 + 0.3 s: refused."""
    s = slo(load_shedding=True, caching=True)
    with_three_decoders(s)
    prompt = [(7 * j) % 90 + 3 for j in range(300)]
    other = [(11 * j) % 90 + 3 for j in range(300)]

    def request(rid: str, tokens: list[int], **kw) -> Request:
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        return Request(request_id=rid, prompt_token_ids=tokens, max_tokens=1, arrival_time=0.0,
                       sampling_params=params, **kw)  # fmt: skip

    s.add_request(request("first", prompt))
    finished = False
    for _ in range(10):
        _, outs = step(s)
        finished |= any(o.request_id == "first" and o.finished for o in outs)
    assert finished and s.kv_cache_manager.num_cached_blocks() >= 18
    s.add_request(request("again", prompt, slo_ttft_s=0.2))
    s.add_request(request("other", other, slo_ttft_s=0.2))
    queries = s.kv_cache_manager.prefix_cache_queries()
    plan, _ = step(s)
    assert [r.request_id for r, _ in plan.rejected] == ["other"]
    assert rows(plan)["again"] == 12  # admitted past its 288 cached tokens
    assert s.kv_cache_manager.prefix_cache_queries() == queries + 300  # the peek counted nothing


def _spend_decode_steps(s, n: int) -> None:
    for _ in range(n):
        step(s, seconds=0.05)  # within every ITL target: gaps, no misses


@pytest.mark.parametrize(("budget", "chunk"), [(0.04, 300), (0.0, 84)])
def test_rescue_runs_a_late_prompt_whole_within_the_itl_miss_budget(budget, chunk):
    """L (300 tokens, deadline 0.35 s) misses in 84-token chunks (4 steps:
    4 x 0.016 + 0.3 = 0.364 s) but makes it whole in one 0.316 s step; after 400 decode gaps
    within target, 3 misses fit a 4 % budget; with no budget it stays late
    and gets the step's 84 tokens."""
    s = slo(itl_miss_budget=budget)
    with_three_decoders(s)
    _spend_decode_steps(s, 134)
    s.add_request(make("L", 300, slo_ttft_s=0.35))
    plan, _ = step(s)
    assert rows(plan)["L"] == chunk
    assert s.num_rescued == (budget > 0)


def test_rescue_waits_until_the_budget_has_room():
    s = slo(itl_miss_budget=0.04)
    with_three_decoders(s)
    _spend_decode_steps(s, 10)  # 30 gaps: 4 % of 33 is not 3 misses
    s.add_request(make("L", 300, slo_ttft_s=0.35))
    plan, _ = step(s)
    assert rows(plan)["L"] == 84 and s.num_rescued == 0


def test_rescue_counts_the_first_tokens_term_once_after_the_decodes():
    """1 ms more for each of a step's first 10 tokens: the three decodes take
    10 + 3 x 2 + 3 x 1 = 19 ms; L's 300 tokens after them cost 300 + 7 x 1 =
    307 ms (rows 4-10 pay the term). Deadline 0.327 s: whole in one step it
    makes it (0.019 + 0.307 = 0.326) though not in ITL-bound chunks (4 steps:
    4 x 0.019 + 0.307 = 0.383), so it is rescued. Counting the term as if L
    were the step's first row (310 ms) would give it up (0.329)."""
    kneed = {**SIMPLE, "a_first_tokens": 0.001, "first_tokens": 10}
    s = slo(cost_model=kneed, itl_miss_budget=0.04)
    with_three_decoders(s)
    _spend_decode_steps(s, 134)
    s.add_request(make("L", 300, slo_ttft_s=0.327))
    plan, _ = step(s)
    assert rows(plan)["L"] == 300 and s.num_rescued == 1


def test_targets_resolve_request_then_class_then_default():
    s = slo(ttft_s=2.0, itl_s=0.2, classes={"1": {"ttft_s": 0.5}, "2": {"itl_s": 0.05}})
    t = s.slo.targets
    assert (t(make("a", 5)).ttft_s, t(make("a", 5)).itl_s) == (2.0, 0.2)
    assert (t(make("b", 5, priority=1)).ttft_s, t(make("b", 5, priority=1)).itl_s) == (0.5, 0.2)
    assert t(make("c", 5, priority=2)).itl_s == 0.05
    r = make("d", 5, priority=1, slo_ttft_s=9.0, slo_itl_s=0.3)
    assert (t(r).ttft_s, t(r).itl_s) == (9.0, 0.3)


def test_the_tightest_itl_target_among_decodes_sets_the_step():
    """d0 asks for 0.05 s: 0.05 - 0.016 = 34 tokens a step."""
    s = slo()
    s.add_request(make("d0", 10, max_tokens=100, slo_itl_s=0.05))
    for i in (1, 2):
        s.add_request(make(f"d{i}", 10, max_tokens=100))
    step(s)
    s.add_request(make("p", 200))
    plan, _ = step(s)
    assert rows(plan)["p"] == 34


@pytest.mark.parametrize(("options", "match"), [
    ({"ttft_s": 0}, "ttft_s"),
    ({"itl_s": -1}, "itl_s"),
    ({"itl_s": "fast"}, "itl_s"),
    ({"ttft_s": float("inf")}, "ttft_s"),
    ({"margin": 0.95}, "margin"),
    ({"itl_miss_budget": 0.6}, "itl_miss_budget"),
    ({"min_chunk_tokens": 0}, "min_chunk_tokens"),
    ({"load_shedding": "yes"}, "load_shedding"),
    ({"adapt": 1}, "adapt"),
    ({"classes": []}, "classes"),
    ({"classes": {"high": {"ttft_s": 1}}}, "classes keys"),
    ({"classes": {"0": 1}}, r'classes\["0"\] must be an object'),
    ({"classes": {"0": {"ttft": 1}}}, "unknown keys"),
    ({"classes": {"0": {"itl_s": 0}}}, r'classes\["0"\]\.itl_s'),
    ({"cost_model": 3}, "cost_model"),
    ({"cost_model": {"overhead": 1}}, "cost_model"),
    ({"cost_model": "/nonexistent.json"}, "cost_model"),
    ({"cost_model": {"overhead": 0, "a_prefill": 0, "a_decode": 0, "a_kv": 0.001}},
     "cost_model: overhead, a_prefill and a_decode are all 0"),
    ({"deadline": 1}, "unknown scheduler_config keys"),
])  # fmt: skip
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        create_scheduler("slo", **options)


def test_the_first_tokens_of_a_step_cost_more_and_the_chunk_shrinks():
    """With 2 ms more for each of a step's first 20 tokens and an ITL target
    of 0.1005 s: the three decodes take 10 + 3 x 2 + 3 x 2 = 22 ms, leaving
    78.5 ms; the chunk's first 17 tokens (rows 4-20) cost 3 ms each (51 ms),
    and 27 more at 1 ms fit the 27.5 ms left: 44 tokens, not 84."""
    kneed = {**SIMPLE, "a_first_tokens": 0.002, "first_tokens": 20}
    s = slo(cost_model=kneed, itl_s=0.1005)
    with_three_decoders(s)
    s.add_request(make("long", 500))
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "long": 44}


def test_startup_log_names_the_model_and_the_decodes_that_fit(caplog):
    """10 ms + 2 ms a decode against 0.101 s: 45 decodes fit (0.1 s), 46 do
    not (0.102 s); the tightest class (0.051 s) fits 20 (0.05 s)."""
    model = {**SIMPLE, "source": "hand-made"}
    with caplog.at_level(logging.INFO, logger="paternoster.schedulers.slo"):
        create_scheduler("slo", max_num_seqs=64, cost_model=model, itl_s=0.101, margin=0.0)
        create_scheduler("slo", max_num_seqs=64, cost_model=model, itl_s=0.101, margin=0.0,
                         classes={"1": {"itl_s": 0.051}})  # fmt: skip
    first, second = (r.getMessage() for r in caplog.records)
    assert "'hand-made'" in first and "up to 45 of the 64 request slots" in first
    assert "0.051 s in the tightest priority class" in second
    assert "up to 20 of the 64" in second


def test_startup_warns_once_when_one_decode_is_over_the_target(caplog, monkeypatch):
    """The step's 10 ms overhead alone is over an ITL target of 5 ms."""
    monkeypatch.setattr(slo_options, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="paternoster.schedulers.slo"):
        for _ in range(2):
            create_scheduler("slo", cost_model=SIMPLE, itl_s=0.005, margin=0.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "one decode alone takes 12 ms" in warnings[0]


def test_a_model_with_free_prefill_plans_without_dividing_by_zero():
    """a_prefill = 0 (a fitter may clamp a coefficient to 0): nothing divides
    by the zero prefill rate, and once requests decode, the 0.084 s the three
    decodes leave holds any prompt whole."""
    s = slo(cost_model={**SIMPLE, "a_prefill": 0.0})
    for i in range(3):
        s.add_request(make(f"d{i}", 10, max_tokens=1000))
    for _ in range(3):  # nothing decodes yet: one min_chunk_tokens chunk a step
        step(s)
    s.add_request(make("p", 300))
    plan, _ = step(s)
    assert rows(plan) == {"d0": 1, "d1": 1, "d2": 1, "p": 300}
