"""Granite 4.0-H against HF transformers' own class on tiny random-weight
checkpoints: Mamba2 and attention layers (without RoPE as released, and
with), routed experts plus a shared MLP (or the shared MLP alone), and
Granite's embedding, residual, attention and logit multipliers. Float32
logits over a chunked prefill and a batched decode step; greedy ids equal
to HF ``generate`` through the engine (5-token chunks; preemption)."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig

from .conftest import engine_greedy, hf_generate
from .hybrid_checks import hybrid_engine, random_prompts
from .test_nemotron_h import test_logits_match_hf_over_chunked_prefill_and_decode as _logits

KINDS = ["moe", "dense", "moe-rope"]
BLOCK_SIZE = 8


def _build(kind: str):
    import transformers as tf

    types = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    cfg = tf.GraniteMoeHybridConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=4, layer_types=types,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
        shared_intermediate_size=80, num_local_experts=0 if kind == "dense" else 6,
        num_experts_per_tok=2, mamba_n_heads=16, mamba_d_head=8, mamba_d_state=16,
        mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16, max_position_embeddings=256,
        embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.3,
        logits_scaling=2.0, pad_token_id=0, tie_word_embeddings=kind != "dense",
        position_embedding_type="rope" if kind == "moe-rope" else None)
    return tf.GraniteMoeHybridForCausalLM(cfg)


@pytest.fixture(scope="module", params=KINDS)
def granite(request, tmp_path_factory):
    torch.manual_seed(KINDS.index(request.param) + 120)
    model = _build(request.param).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2 and "conv1d" not in name:
                param.normal_(0.0, 0.08)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(("dt_bias", ".D")):
                param.uniform_(-0.5, 1.0)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model.eval()


def test_logits_match_hf_over_chunked_prefill_and_decode(granite):
    _logits(granite)


@pytest.mark.parametrize(("scheduler", "budget", "blocks"),
                         [("chunked_prefill", 5, 64), ("fcfs", 256, 8)],
                         ids=["chunked-5", "preempting"])
def test_engine_greedy_ids_equal_hf_generate(granite, scheduler, budget, blocks):
    kind, path, hf = granite
    engine = hybrid_engine(path, scheduler, budget, blocks)
    # 8 blocks of 8 (one attention layer) hold two of these with their growth, not four.
    prompts = random_prompts((26, 27, 28, 29) if blocks == 8 else (1, 20, 13, 60))
    ours = engine_greedy(engine, prompts, 10)
    if blocks == 8:
        assert engine.stats()["num_preemptions_total"] > 0
    assert ours == [hf_generate(hf, p, 10) for p in prompts]


def test_a_layer_type_of_another_family_is_refused_by_name(tmp_path):
    """A Granite config naming LFM2's ``conv`` kind: the runner refuses it
    naming the kinds Granite has, before it lays out the caches."""
    from paternoster.model.runner import ModelRunner

    model = _build("dense")
    model.config.layer_types = ["linear_attention", "conv", "full_attention", "linear_attention"]
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="layer types must be 'linear_attention' or"):
        ModelRunner(ModelConfig(model=str(tmp_path), dtype="float32"),
                    CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=16))
