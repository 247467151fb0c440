"""Sliding-window attention end to end: tiny random-weight Mistral (every
layer windowed: one KV cache group that releases blocks), Gemma 3 and Qwen2,
Qwen3 and SmolLM3 with ``use_sliding_window`` (full and windowed layers: two
groups sharing cache slots) through the whole engine (C++ KVCacheManager and BatchBuilder, the
scheduler, the runner), greedy ids against HF transformers' own ``generate``
in float32 far past the window: whole prompts, chunked prefill with chunk
boundaries inside the window, prefix-cache hits, preemption; and the blocks a
long request holds stay bounded by the window."""

from __future__ import annotations

import pytest
import torch

from paternoster import SamplingParams
from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreRequest

from .test_tiny_models import SMALL

WINDOW = 8
BLOCK_SIZE = 4
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(31)
    cfg = MistralConfig(**SMALL, sliding_window=WINDOW, rope_theta=1000.0, head_dim=16,
                        tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("mistral_window")
    model = MistralForCausalLM(cfg).float()
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def qwen2_mixed(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(32)
    cfg = Qwen2Config(**{**SMALL, "num_hidden_layers": 3}, use_sliding_window=True,
                      sliding_window=WINDOW, max_window_layers=1, rope_theta=1000.0,
                      tie_word_embeddings=True)
    assert cfg.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    path = tmp_path_factory.mktemp("qwen2_window")
    model = Qwen2ForCausalLM(cfg).float()
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def qwen3_mixed(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(33)
    cfg = Qwen3Config(**SMALL, head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
                      max_window_layers=1, rope_theta=1000.0)
    path = tmp_path_factory.mktemp("qwen3_window")
    model = Qwen3ForCausalLM(cfg).float()
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def smollm3_window(tmp_path_factory):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(34)
    cfg = SmolLM3Config(**{**SMALL, "num_hidden_layers": 4}, use_sliding_window=True,
                        sliding_window=WINDOW, max_window_layers=2, rope_theta=1000.0,
                        pad_token_id=0)
    assert "sliding_attention" in cfg.layer_types and "full_attention" in cfg.layer_types
    path = tmp_path_factory.mktemp("smollm3_window")
    model = SmolLM3ForCausalLM(cfg).float()
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(35)
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    cfg = Gemma3TextConfig(**{**SMALL, "num_hidden_layers": 3}, head_dim=16,
                           query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=types,
                           rope_theta=1000.0, rope_local_base_freq=100.0, pad_token_id=0,
                           initializer_range=0.1)
    model = Gemma3ForCausalLM(cfg).float()
    with torch.no_grad():  # Gemma norms scale by 1 + w: move w away from 0
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    path = tmp_path_factory.mktemp("gemma3_window")
    model.save_pretrained(path)
    return path, model.eval()


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine(path, *, chunk: int = 256, num_kv_blocks: int = 256, caching: bool = False,
           max_num_seqs: int = 4) -> EngineCore:
    return EngineCore(EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32", max_model_len=200),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks,
                          enable_prefix_caching=caching),
        # fcfs keeps prompts whole (its budget rises to max_model_len): smaller
        # chunks need the chunked-prefill policy.
        scheduler=SchedulerConfig(scheduler="fcfs" if chunk >= 200 else "chunked_prefill",
                                  max_num_seqs=max_num_seqs, max_num_batched_tokens=chunk),
    ))


def run(eng: EngineCore, prompts: dict[str, list[int]], n: int = NEW_TOKENS,
        one_at_a_time: bool = False) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    pending = list(prompts.items())
    while pending or eng.has_unfinished_requests():
        if pending and (not one_at_a_time or not eng.has_unfinished_requests()):
            rid, p = pending.pop(0)
            eng.add_request(EngineCoreRequest(rid, p, params))
        for o in eng.step():
            out[o.request_id].extend(o.new_token_ids)
    return out


def prompts(seed: int, lengths=(5, 23, 41)) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return {f"r{n}": torch.randint(1, SMALL["vocab_size"], (n,), generator=gen).tolist()
            for n in lengths}


MODELS = ["mistral", "qwen2_mixed", "qwen3_mixed", "smollm3_window", "gemma3"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("chunk", [256, 5], ids=["whole-prompts", "chunks-of-5"])
def test_greedy_matches_hf_generate_past_the_window(model, chunk, request):
    path, hf = request.getfixturevalue(model)
    ps = prompts(1)
    eng = engine(path, chunk=chunk)
    groups = eng.kv_cache_manager.num_groups()
    assert (groups == 1) == (model == "mistral")  # the others mix full and windowed layers
    got = run(eng, ps)
    for rid, p in ps.items():
        assert got[rid] == hf_greedy(hf, p, NEW_TOKENS), rid


@pytest.mark.parametrize("model", ["mistral", "gemma3"])
def test_prefix_cache_hits_past_the_window(model, request):
    path, hf = request.getfixturevalue(model)
    base = prompts(2, lengths=(37,))["r37"]
    ps = {"a": base, "b": base + [3, 4, 5], "c": base[:30] + [7] * 9}
    eng = engine(path, caching=True, chunk=16)
    got = run(eng, ps, one_at_a_time=True)
    assert eng.kv_cache_manager.prefix_cache_hits() > 0
    for rid, p in ps.items():
        assert got[rid] == hf_greedy(hf, p, NEW_TOKENS), rid


NUM_PREEMPT_BLOCKS = {"mistral": 8, "gemma3": 40}


@pytest.mark.parametrize("model", ["mistral", "gemma3"])
def test_preemption_past_the_window(model, request):
    # Few blocks for three long requests at once: some are preempted and
    # recomputed; their tokens must not change.
    path, hf = request.getfixturevalue(model)
    ps = prompts(3, lengths=(30, 34, 38))
    eng = engine(path, chunk=12, num_kv_blocks=NUM_PREEMPT_BLOCKS[model])
    got = run(eng, ps, n=40)
    assert eng.scheduler.num_preemptions_total > 0
    for rid, p in ps.items():
        assert got[rid] == hf_greedy(hf, p, 40), rid


def test_a_long_request_holds_window_sized_blocks(mistral):
    # 150 tokens with a window of 8 in blocks of 4: the 20-token prompt (one
    # chunk) takes 5 blocks, then every decode step needs at most
    # ceil((8 - 1 + 1) / 4) + 1 = 3, where a full allocation would reach 38.
    # The engine serves it from 10 blocks.
    path, hf = mistral
    eng = engine(path, chunk=20, num_kv_blocks=10)
    assert eng.max_model_len == 200
    p = prompts(4, lengths=(20,))["r20"]
    params = SamplingParams(temperature=0.0, max_tokens=130, ignore_eos=True)
    eng.add_request(EngineCoreRequest("long", p, params))
    held: list[tuple[int, int]] = []  # (tokens generated, blocks held) after each step
    tokens: list[int] = []
    kv = eng.kv_cache_manager
    while eng.has_unfinished_requests():
        for o in eng.step():
            tokens.extend(o.new_token_ids)
        if kv.num_requests():
            held.append((len(tokens), 10 - kv.num_free_blocks()))
    assert len(tokens) == 130
    assert max(b for _, b in held) == 5
    assert max(b for n, b in held if n > 1) <= 3
    assert tokens == hf_greedy(hf, p, 130)


def test_whole_prompt_scheduler_caps_the_context_at_what_a_prompt_step_holds(mistral):
    # fcfs prefills prompts whole: that step holds every block of the prompt,
    # so 10 blocks of 4 cap the context at 40 (a chunked policy: 200, above).
    path, hf = mistral
    eng = engine(path, num_kv_blocks=10)
    assert eng.scheduler.__class__.__name__ == "FCFSScheduler"
    assert eng.max_model_len == 40
    p = prompts(5, lengths=(36,))["r36"]
    assert run(eng, {"a": p}, n=4)["a"] == hf_greedy(hf, p, 4)
