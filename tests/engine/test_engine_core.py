"""EngineCore end to end on the default model, against HF transformers' own greedy generate."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.sampling_params import SamplingParams

from .conftest import make_request

PROMPT_LENGTHS = [1, 4, 17, 40, 77, 128, 213, 310]
MAX_NEW_TOKENS = 20

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden screw press into a "
    "system that could produce books far faster than scribes. Within fifty years presses "
    "were working in more than two hundred European cities, and millions of volumes had "
    "been printed. Scholars argue about how much the press changed the world: some credit "
    "it with the Reformation, the scientific revolution and the rise of literacy, while "
    "others point out that manuscript culture persisted for generations and that most "
    "early printed books were religious or legal texts. What is clear is that the cost of "
    "copying knowledge fell dramatically, that errors could be corrected in later "
    "editions, and that standardized texts allowed readers in distant places to discuss "
    "exactly the same words. The same pattern repeated with the telegraph, the telephone, "
    "radio, television and the internet: each lowered the cost of moving information and "
    "each was accompanied by predictions of utopia and of ruin. Engineers who build these "
    "systems learn to measure rather than guess, to test against independent references, "
    "and to respect the constraints of memory and bandwidth that govern every machine. "
    "A serving engine for language models is no different: it must keep the hardware "
    "busy, share memory fairly between many requests, and never lose a request. "
    "Gardeners know a similar lesson: soil, water and light are shared by every plant in "
    "a bed, and a careful gardener spaces seedlings so that each one gets enough of all "
    "three while none of the bed lies bare. Cooks, too, schedule their burners and ovens "
    "so that every dish of a dinner arrives hot at the same moment, starting the slow "
    "braise first and searing the fish last. Railway dispatchers, air traffic "
    "controllers and the operators of elevators in tall buildings all solve versions of "
    "the same puzzle: many travellers, limited capacity, and a promise that nobody waits "
    "forever. The paternoster lift, a chain of open cabins that never stops moving, lets "
    "passengers step on and off at every floor, and it gives this project its name."
)


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert len(ids) >= max(PROMPT_LENGTHS)
    # Different offsets so prompts differ, not only in length.
    return [ids[i : i + n] for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture(scope="module")
def hf_greedy(default_model_path, prompts) -> list[list[int]]:
    """HF transformers' own greedy generate, one prompt at a time, float32."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32)
    model.eval()
    refs = []
    with torch.inference_mode():
        for p in prompts:
            inp = torch.tensor([p])
            out = model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=MAX_NEW_TOKENS,
                min_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
            refs.append(out[0, len(p) :].tolist())
    return refs


def make_engine(path, scheduler: SchedulerConfig | None = None, **cache) -> EngineCore:
    return EngineCore(
        EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32", max_model_len=512),
            cache=CacheConfig(**cache),
            scheduler=scheduler or SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
        )
    )


def run_overlapping(engine: EngineCore, prompts: list[list[int]]) -> dict[str, list[int]]:
    """Submit two prompts per step so requests overlap in time; collect greedy tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    finished = set()
    for _ in range(10_000):
        for _ in range(2):
            if pending:
                i, p = pending.pop(0)
                engine.add_request(make_request(f"p{i}", p, params))
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.finish_reason == "length"
                finished.add(out.request_id)
        if not pending and not engine.has_unfinished_requests():
            break
    assert len(finished) == len(prompts)
    return tokens


def test_greedy_matches_hf_generate(default_model_path, prompts, hf_greedy):
    engine = make_engine(default_model_path, num_kv_blocks=256, block_size=16)
    got = run_overlapping(engine, prompts)
    for i, ref in enumerate(hf_greedy):
        assert got[f"p{i}"] == ref, f"prompt {i} ({len(prompts[i])} tokens)"
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_kv_blocks"]
    # Requests overlapped: some step ran more than one request.
    assert max(len(rec.scheduled) for rec in engine.step_log) > 1


def test_greedy_matches_hf_generate_under_preemption(default_model_path, prompts, hf_greedy):
    # 40 blocks x 8 tokens = 320 slots: the longest request (310 + 20 tokens) fits
    # alone, but the eight together (~1 000 tokens) do not.
    engine = make_engine(default_model_path, num_kv_blocks=42, block_size=8)
    got = run_overlapping(engine, prompts)
    assert engine.stats()["num_preemptions_total"] > 0
    for i, ref in enumerate(hf_greedy):
        assert got[f"p{i}"] == ref, f"prompt {i} ({len(prompts[i])} tokens)"
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_kv_blocks"]


def test_continuous_batching_short_requests_join_and_leave(default_model_path, prompts):
    engine = make_engine(default_model_path, num_kv_blocks=256, block_size=16)
    long_params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    short_params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request(make_request("long", prompts[3], long_params))
    finished_at: dict[str, int] = {}
    step = 0
    while engine.has_unfinished_requests():
        if step == 5:
            for i in range(3):
                engine.add_request(make_request(f"short{i}", prompts[i + 1], short_params))
        for out in engine.step():
            if out.finished:
                finished_at[out.request_id] = step
        step += 1
    log = list(engine.step_log)
    joined = [rec for rec in log if {"long", "short0"} <= {rid for rid, _ in rec.scheduled}]
    assert joined, "short requests never ran in the same step as the long one"
    for i in range(3):
        assert finished_at[f"short{i}"] < finished_at["long"]
    # The long request never stopped: one token in every step after its prefill.
    long_steps = [rec.step for rec in log if any(rid == "long" for rid, _ in rec.scheduled)]
    assert long_steps == list(range(long_steps[0], long_steps[0] + len(long_steps)))


def test_abort_and_rejections_free_every_block(default_model_path, prompts):
    engine = make_engine(default_model_path, num_kv_blocks=64, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i, p in enumerate(prompts[:5]):
        engine.add_request(make_request(f"a{i}", p, params))
    for _ in range(3):
        engine.step()
    outs = engine.abort_requests(["a0", "a3", "nope"])
    assert sorted(o.request_id for o in outs) == ["a0", "a3"]
    assert all(o.finish_reason == "abort" for o in outs)
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_kv_blocks"]
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(make_request("big", [5] * 600, params))
    with pytest.raises(ValueError, match="max_tokens"):
        too_many = SamplingParams(max_tokens=500)
        engine.add_request(make_request("big2", [5] * 100, too_many))
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request(make_request("empty", [], params))


@pytest.mark.parametrize(
    ("budget", "threshold", "num_prompts"),
    [(64, 1, 4), (7, 0, 6), (100, 33, 8)],
    ids=["chunk-1", "budget-7", "threshold-33"],
)
def test_chunked_prefill_matches_whole_prefill(
    default_model_path, prompts, hf_greedy, budget, threshold, num_prompts
):
    sched = SchedulerConfig(
        scheduler="chunked_prefill",
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        policy_config={"long_prefill_token_threshold": threshold},
    )
    engine = make_engine(default_model_path, sched, num_kv_blocks=256, block_size=16)
    got = run_overlapping(engine, prompts[:num_prompts])
    for i, ref in enumerate(hf_greedy[:num_prompts]):
        assert got[f"p{i}"] == ref, f"prompt {i} ({len(prompts[i])} tokens)"
    log = list(engine.step_log)
    assert max(sum(n for _, n in rec.scheduled) for rec in log) <= budget
    if threshold:
        assert max(n for rec in log for _, n in rec.scheduled) <= threshold


def test_priority_preempts_low_and_victim_output_is_unchanged(
    default_model_path, prompts, hf_greedy
):
    # 42 blocks x 8 tokens: the 310-token request fills 39 blocks; the 128-token
    # high-priority request cannot fit without preempting it.
    sched = SchedulerConfig(
        scheduler="priority",
        max_num_seqs=8,
        max_num_batched_tokens=512,
        policy_config={"aging_steps": 0},
    )
    engine = make_engine(default_model_path, sched, num_kv_blocks=42, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    engine.add_request(make_request("low", prompts[7], params, priority=5))
    tokens: dict[str, list[int]] = {"low": [], "high": []}
    finished_order = []
    for step in range(10_000):
        if step == 3:
            engine.add_request(make_request("high", prompts[5], params, priority=0))
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                finished_order.append(out.request_id)
        if step > 3 and not engine.has_unfinished_requests():
            break
    assert engine.stats()["num_preemptions_total"] >= 1
    assert finished_order == ["high", "low"]
    assert tokens["high"] == hf_greedy[5]
    assert tokens["low"] == hf_greedy[7]
    assert engine.stats()["num_free_blocks"] == engine.stats()["num_kv_blocks"]
