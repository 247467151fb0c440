"""Gemma 3 text models against HF transformers' own Gemma3ForCausalLM on tiny
random-weight checkpoints (sliding and full layers mixed, local and global
RoPE, linear scaling on the global one, logit soft-capping in one case):
float32 logits over a chunked prefill + decode, greedy ids equal to HF
``generate`` through the engine (whole and chunked prefill, prefix-cache
hits, preemption), and the configs we cannot run refused by name.

These contexts stay within the window (32); tests/model/test_sliding_window.py
runs Gemma 3 far past its window.
"""

from __future__ import annotations

import json

import pytest
import torch

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.model.rope import inverse_frequencies, rope_parameters
from paternoster.model.runner import ModelRunner

from .conftest import engine_greedy, greedy_matches_hf_generate, hf_generate
from .test_tiny_models import SMALL, _compare

WINDOW = 32
TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
BLOCK_SIZE = 8


def _gemma3(tmp_path_factory, seed: int, **kwargs):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    # head_dim 24 != hidden / heads, query_pre_attn_scalar != head_dim: both read
    # from the config. Distinct local and global RoPE, the global one scaled.
    # Weights of std 0.1 (not 0.02): activations large enough for the GELU's
    # approximation and the soft-cap to show in the logits.
    cfg = Gemma3TextConfig(**{**SMALL, "num_hidden_layers": len(TYPES)}, head_dim=24,
                           query_pre_attn_scalar=20, sliding_window=WINDOW, layer_types=TYPES,
                           rope_theta=1000.0, rope_local_base_freq=100.0,
                           rope_scaling={"rope_type": "linear", "factor": 4.0},
                           initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           **kwargs)
    model = Gemma3ForCausalLM(cfg).float()
    with torch.no_grad():  # norm weights (0 at init: scale 1 + w) away from 0, so they matter
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    path = tmp_path_factory.mktemp("gemma3")
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _gemma3(tmp_path_factory, 51)


@pytest.fixture(scope="module")
def gemma3_softcapped(tmp_path_factory):
    """Final logits soft-capped at 1.5, inside the range of the raw logits
    (up to about 3.7)."""
    return _gemma3(tmp_path_factory, 52, final_logit_softcapping=1.5, tie_word_embeddings=False)


def test_gemma3_matches_hf_forward(gemma3, attn_ops):
    path, hf = gemma3
    runner = _compare(path, hf, attn_ops, lengths=(1, 31, 20, 9))
    model = runner.model
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.lm_head is model.embed_tokens
    assert [layer.self_attn.sliding_window for layer in model.layers] == [WINDOW, 0, WINDOW, 0]
    # One-token steps are the ones the core's decoder stack would take: never for Gemma 3.
    assert model._decoder_stack(1, runner.kv_caches) is None


def test_gemma3_final_logit_softcapping_matches_hf_forward(gemma3_softcapped, attn_ops):
    path, hf = gemma3_softcapped
    runner = _compare(path, hf, attn_ops, lengths=(1, 30, 12))
    assert runner.model.lm_head is not runner.model.embed_tokens
    with torch.inference_mode():
        logits = hf(torch.arange(1, 20)[None]).logits
    assert 1.4 < logits.abs().max() < 1.5  # the cap bends the largest logits


def test_gemma3_norm_and_scaled_embeddings_give_hfs_bits_in_bfloat16(attn_ops):
    """The casts of HF's Gemma3RMSNorm (weight applied in float32, one cast at
    the end) and of its embedding scale (sqrt(H) rounded to the model dtype)."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import (
        Gemma3RMSNorm,
        Gemma3TextScaledWordEmbedding,
    )

    from paternoster.model.gemma3 import Gemma3ForCausalLM, GemmaRMSNorm

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 48, generator=gen).to(torch.bfloat16) * 3
    ref = Gemma3RMSNorm(48, eps=1e-6).to(torch.bfloat16)
    ours = GemmaRMSNorm(48, 1e-6, torch.bfloat16)
    with torch.no_grad():
        ref.weight.uniform_(-1, 1, generator=gen)
        ours.weight.copy_(ref.weight)
    assert torch.equal(ours(x), ref(x))
    # sqrt(48) is not a bfloat16 number: HF rounds it before the product.
    cfg = Gemma3TextConfig(**{**SMALL, "hidden_size": 48}, head_dim=16, layer_types=TYPES[:2],
                           sliding_window=WINDOW)
    model = Gemma3ForCausalLM(cfg, torch.bfloat16, attn_ops, max_positions=WINDOW)
    table = Gemma3TextScaledWordEmbedding(128, 48, 0, embed_scale=48**0.5).to(torch.bfloat16)
    assert model.embed_scale != 48**0.5
    ids = torch.arange(0, 20)
    assert torch.equal(table.weight[ids] * model.embed_scale, table(ids))


def test_gemma3_rope_tables_are_hfs_local_and_global(gemma3):
    path, hf = gemma3
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=8))
    rotary = hf.model.rotary_emb
    glob = inverse_frequencies(24, rope_parameters(runner.hf_config))
    local = inverse_frequencies(24, rope_parameters(runner.hf_config, "sliding_attention"))
    torch.testing.assert_close(glob, rotary.full_attention_inv_freq, rtol=1e-6, atol=0)
    torch.testing.assert_close(local, rotary.sliding_attention_inv_freq, rtol=1e-6, atol=0)
    model = runner.model
    assert model.rotary.cos.shape[0] == model.local_rotary.cos.shape[0] == runner.max_model_len


def test_gemma3_layers_form_kv_cache_groups(gemma3):
    """Sliding and full layers in separate KV cache groups sharing slots; the
    context is not capped at the window."""
    path, _ = gemma3
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32", max_model_len=200),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64))
    layout = runner.kv_layout
    assert layout.group_windows == (WINDOW, 0) and layout.num_slots == 2
    assert [layer.self_attn.sliding_window for layer in runner.model.layers] == [WINDOW, 0,
                                                                                  WINDOW, 0]
    assert [layer.self_attn.kv_group for layer in runner.model.layers] == [0, 1, 0, 1]
    assert runner.max_model_len == 200


def test_gemma3_greedy_ids_equal_hf_generate(gemma3, attn_ops):
    path, hf = gemma3
    ours, ref = greedy_matches_hf_generate(path, hf, attn_ops, [5, 17, 33, 2, 90, 64, 7], 20)
    assert ours == ref


def _engine(path, scheduler: str, budget: int, blocks: int) -> EngineCore:
    return EngineCore(EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32"),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=blocks),
        scheduler=SchedulerConfig(scheduler=scheduler, max_num_seqs=4,
                                  max_num_batched_tokens=budget),
    ))


@pytest.mark.parametrize(("scheduler", "budget", "blocks"),
                         [("fcfs", 256, 64), ("chunked_prefill", 5, 64), ("fcfs", 256, 14)],
                         ids=["whole-prefill", "chunked-5", "preempting"])
def test_gemma3_engine_greedy_ids_equal_hf_generate(gemma3, scheduler, budget, blocks):
    """Through the engine: prompts of 1-20 tokens plus 10 generated, all within the window."""
    path, hf = gemma3
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(3, SMALL["vocab_size"], (n,), generator=gen).tolist()
               for n in (1, 20, 13, 17)]
    engine = _engine(path, scheduler, budget, blocks)
    ours = engine_greedy(engine, prompts, 10)
    if blocks == 14:
        assert engine.stats()["num_preemptions_total"] > 0
    assert ours == [hf_generate(hf, p, 10) for p in prompts]


def test_gemma3_prefix_cache_hit_gives_hf_generate_ids(gemma3):
    path, hf = gemma3
    gen = torch.Generator().manual_seed(10)
    shared = torch.randint(3, SMALL["vocab_size"], (17,), generator=gen).tolist()  # 2 blocks
    prompts = [shared + [40, 41, 42], shared + [50]]
    engine = _engine(path, "fcfs", 256, 64)
    first = engine_greedy(engine, prompts[:1], 8)
    hits = engine.stats()["prefix_cache_hits"]
    second = engine_greedy(engine, prompts[1:], 8)
    assert engine.stats()["prefix_cache_hits"] > hits
    assert first + second == [hf_generate(hf, p, 8) for p in prompts]


def _with_config(path, tmp_path, change: dict):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(change)
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(("change", "match"), [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"layer_types": TYPES[:3] + ["chunked_attention"]}, "layer_types"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
])
def test_gemma3_unsupported_configs_are_refused(gemma3, tmp_path, change, match):
    d = _with_config(gemma3[0], tmp_path, change)
    with pytest.raises(ValueError, match=match):
        ModelRunner(ModelConfig(model=str(d)), CacheConfig(num_kv_blocks=4))
