"""Greedy ids through the whole engine (scheduler, C++ KV cache manager and
batch builder, runner) equal HF ``generate``'s for every full-attention
architecture, on tiny random-weight checkpoints in float32: prompts prefilled
in 5-token chunks, a prefix-cache hit, and a run that preempts and recomputes.
(Gemma 3, gpt-oss, the windowed models and the hybrid Qwen3-Next / Qwen3.5
have their own files, which run the same cases.)"""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore

from .conftest import engine_greedy, hf_generate

BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            pad_token_id=0)
MOE = dict(num_experts_per_tok=2, tie_word_embeddings=False)
ARCHS = ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3", "smollm3"]


def _build(arch: str):
    import transformers as tf

    if arch == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**BASE))
    if arch == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**BASE))
    if arch == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**BASE, head_dim=24))
    if arch == "qwen3_moe":
        return tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**BASE, **MOE, num_experts=4,
                                                        moe_intermediate_size=32))
    if arch == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(**BASE, **MOE, num_local_experts=4,
                                                      sliding_window=None))
    if arch == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(**BASE))
    return tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**BASE, no_rope_layers=[1, 0]))


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    torch.manual_seed(ARCHS.index(request.param) + 80)
    hf = _build(request.param).float()
    with torch.no_grad():  # sharper logits than the 0.02 init: fewer near-ties
        for param in hf.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return path, hf.eval()


def _engine(path, *, blocks: int, budget: int, caching: bool = False) -> EngineCore:
    return EngineCore(EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32"),
        cache=CacheConfig(block_size=8, num_kv_blocks=blocks, enable_prefix_caching=caching),
        scheduler=SchedulerConfig(scheduler="chunked_prefill", max_num_seqs=4,
                                  max_num_batched_tokens=budget)))


def _prompts(seed: int, lengths) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 128, (n,), generator=gen).tolist() for n in lengths]


def test_chunked_prefill_and_prefix_cache_hit(model):
    path, hf = model
    engine = _engine(path, blocks=64, budget=5, caching=True)
    shared = _prompts(1, (19,))[0]  # two full blocks of 8 shared
    prompts = [shared + [40, 41], shared + [50]]
    first = engine_greedy(engine, prompts[:1], 8)
    hits = engine.kv_cache_manager.prefix_cache_hits()
    second = engine_greedy(engine, prompts[1:], 8)
    assert engine.kv_cache_manager.prefix_cache_hits() - hits == 16
    assert first + second == [hf_generate(hf, p, 8) for p in prompts]


def test_preemption_recomputes_the_same_tokens(model):
    path, hf = model
    engine = _engine(path, blocks=16, budget=64)
    prompts = _prompts(2, (36, 37, 38, 39))
    got = engine_greedy(engine, prompts, 10)
    assert engine.stats()["num_preemptions_total"] > 0
    assert got == [hf_generate(hf, p, 10) for p in prompts]
