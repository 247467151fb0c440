"""Prefix caching in the Scheduler base class, on a real C++ KV cache manager
with caching on and fake model outputs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paternoster import _core
from paternoster.config import SchedulerConfig
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.registry import load_scheduler_class

from .conftest import run_step

BLOCK_SIZE = 4


def create_scheduler(
    name: str = "fcfs",
    num_blocks: int = 64,
    caching: bool = True,
    max_model_len: int = 64,
    **limits,
):
    kv = _core.KVCacheManager(num_blocks, BLOCK_SIZE, enable_caching=caching)
    config = SchedulerConfig(
        scheduler=name,
        max_num_seqs=limits.get("max_num_seqs", 8),
        max_num_batched_tokens=limits.get("max_num_batched_tokens", 64),
    )
    return load_scheduler_class(name)(config, kv, _core.BatchBuilder(kv), max_model_len)


def request(rid: str, prompt: list[int], max_tokens: int = 2, **params) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),
        eos_token_id=None,
        max_tokens=max_tokens,
    )


def run_to_completion(sched) -> None:
    for _ in range(100):
        if not sched.has_unfinished_requests():
            return
        run_step(sched)
    raise AssertionError("did not finish")


PROMPT = list(range(10, 24))  # 14 tokens: 3 whole blocks + 2


def test_admission_counts_cached_blocks_as_computed() -> None:
    sched = create_scheduler()
    sched.add_request(request("a", PROMPT))
    run_to_completion(sched)
    sched.add_request(request("b", PROMPT[:10] + [99, 98]))  # shares 2 whole blocks
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == [12 - 8]
    kv = sched.kv_cache_manager
    assert kv.prefix_cache_hits() == 8
    assert kv.prefix_cache_queries() == 14 + 12


def test_same_prompt_recomputes_only_the_last_block_token() -> None:
    sched = create_scheduler()
    sched.add_request(request("a", PROMPT[:12]))
    run_to_completion(sched)
    sched.add_request(request("b", PROMPT[:12]))
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == [4]  # blocks 0-1 hit; block 2 holds the last token


def test_caching_off_changes_nothing() -> None:
    sched = create_scheduler(caching=False)
    assert not sched.prefix_caching
    sched.add_request(request("a", PROMPT))
    run_to_completion(sched)
    sched.add_request(request("b", PROMPT))
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == [14]


def test_prompt_logprobs_skip_the_lookup() -> None:
    sched = create_scheduler()
    sched.add_request(request("a", PROMPT))
    run_to_completion(sched)
    sched.add_request(request("b", PROMPT, prompt_logprobs=1))
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == [14]


def test_unadmitted_request_gives_hit_blocks_back() -> None:
    sched = create_scheduler(num_blocks=8)
    sched.add_request(request("a", PROMPT))
    run_to_completion(sched)
    kv = sched.kv_cache_manager
    sched.add_request(request("big", list(range(28)), max_tokens=4))  # 7 blocks
    run_step(sched)
    # "big" evicted "a"'s cached blocks and holds 7 of 8: "c" waits, holding nothing.
    sched.add_request(request("c", PROMPT))
    plan, _ = run_step(sched)
    assert [r.request_id for r in plan.scheduled] == ["big"]
    assert not kv.has_request(sched.requests["c"].internal_id)
    assert sched.requests["c"].num_computed_tokens == 0
    run_to_completion(sched)
    assert kv.num_free_blocks() == 8


def test_preempted_request_re_hits_its_own_blocks() -> None:
    # 6 blocks: "a" (14-token prompt + decode) and "b" cannot both grow.
    sched = create_scheduler(num_blocks=6)
    sched.add_request(request("a", PROMPT, max_tokens=8))
    sched.add_request(request("b", list(range(50, 58)), max_tokens=8))
    preempted = None
    for _ in range(40):
        plan, _ = run_step(sched)
        if plan.preempted:
            preempted = plan.preempted[0]
            break
    assert preempted is not None
    hits_before = sched.kv_cache_manager.prefix_cache_hits()
    for _ in range(40):
        plan, _ = run_step(sched)
        if preempted in plan.scheduled:
            n = plan.num_scheduled_tokens[plan.scheduled.index(preempted)]
            assert n < preempted.num_tokens  # resumed past its cached blocks
            break
    assert sched.kv_cache_manager.prefix_cache_hits() > hits_before
    run_to_completion(sched)
    assert sched.kv_cache_manager.num_free_blocks() == 6


def test_chunked_prefill_caches_each_chunk() -> None:
    sched = create_scheduler("chunked_prefill", max_num_batched_tokens=8)
    sched.add_request(request("a", PROMPT, max_tokens=3))
    run_step(sched)  # 8 prompt tokens: 2 blocks cached
    assert sched.kv_cache_manager.num_cached_blocks() == 2
    run_to_completion(sched)
    # "a" ended as PROMPT + [7, 7, 7] with KV for 16 tokens (the last sampled
    # token is never computed): 4 blocks cached, output tokens included.
    assert sched.kv_cache_manager.num_cached_blocks() == 4
    sched.add_request(request("b", PROMPT + [7, 7, 5, 6]))
    plan, _ = run_step(sched)
    assert plan.num_scheduled_tokens == [18 - 16]


POLICIES = ["fcfs", "chunked_prefill", "priority", "static", "fair", "slo"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    requests=st.lists(
        st.tuples(
            st.integers(0, 10),  # arrival step
            st.integers(0, 2),  # which shared prefix
            st.integers(1, 30),  # prompt length
            st.integers(1, 10),  # output length
            st.integers(0, 3),  # priority; also the tenant (0: anonymous)
        ),
        min_size=1,
        max_size=12,
    ),
    num_blocks=st.integers(14, 50),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(8, 64),
)
def test_invariants_with_caching_on_random_traces(
    policy, requests, num_blocks, max_num_seqs, budget
):
    """Shared prefixes, preemptions, every policy: no block is freed while in
    use (ref counts equal table references), blocks are shared only between
    requests whose tokens agree up to that block, no token is lost, and every
    block is free at the end."""
    max_model_len = 52
    if policy not in ("chunked_prefill", "fair", "slo"):
        budget = max(budget, max_model_len)
    s = create_scheduler(
        policy,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
    )
    kv = s.kv_cache_manager
    prefixes = [[5] * 40, [(j % 3) + 1 for j in range(40)], list(range(40, 0, -1))]
    pending = sorted(enumerate(requests), key=lambda x: x[1][0])
    delivered: dict[str, list[int]] = {}
    step = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            i, (_, which, prompt_len, out_len, prio) = pending.pop(0)
            prompt = prefixes[which][:prompt_len]
            r = request(f"q{i}", prompt, max_tokens=out_len, ignore_eos=True)
            r.priority = prio
            r.tenant = f"t{prio}" if prio else None
            s.add_request(r)
        _, outs = run_step(s, token=step % 3 + 1)
        for o in outs:
            delivered.setdefault(o.request_id, []).extend(o.new_token_ids)
        live = list(s.requests.values())
        owners: dict[int, list[tuple[Request, int]]] = {}
        for r in live:
            if kv.has_request(r.internal_id):
                for idx, b in enumerate(kv.block_table(r.internal_id)):
                    owners.setdefault(int(b), []).append((r, idx))
        for b in range(num_blocks):
            assert kv.pool.ref_count(b) == len(owners.get(b, ())), "ref count != references"
        for users in owners.values():
            (r0, i0), *rest = users
            for r1, i1 in rest:
                assert i0 == i1
                end = (i0 + 1) * BLOCK_SIZE
                tokens0 = (r0.prompt_token_ids + r0.output_token_ids)[:end]
                tokens1 = (r1.prompt_token_ids + r1.output_token_ids)[:end]
                assert tokens0 == tokens1, "block shared between different prefixes"
        step += 1
        assert step < 5_000, "requests did not finish"
    for i, (*_, out_len, _) in enumerate(requests):
        assert len(delivered[f"q{i}"]) == out_len, "lost or extra tokens"
    assert kv.num_free_blocks() == num_blocks
