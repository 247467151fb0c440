"""Tiny random-weight Qwen2 and Llama-3.1-style (llama3 rope scaling) models saved
with transformers' save_pretrained: our logits match HF's own forward in float32
(max |diff| < 1e-4; logits are O(1))."""

from __future__ import annotations

import json

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.loader import MODEL_CLASSES, model_class
from paternoster.model.rope import inverse_frequencies, rope_parameters
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, hf_logits

ATOL = 1e-4
BLOCK_SIZE = 8
SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)


def _save(model, path, **kwargs):
    model.save_pretrained(path, **kwargs)
    return path


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**SMALL, tie_word_embeddings=False, rope_theta=1000.0)
    model = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # random non-zero biases so that they matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    # Shard it, so loading goes through model.safetensors.index.json.
    return _save(model, tmp_path_factory.mktemp("qwen2"), max_shard_size="100KB")


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(**SMALL, head_dim=16, tie_word_embeddings=True, rope_parameters=rope)
    return _save(LlamaForCausalLM(cfg).float(), tmp_path_factory.mktemp("llama3"))


def _compare(model_dir, hf, attn_ops, lengths=(1, 37, 150, 90)):
    """Two steps (first halves, then the rest) vs ``hf`` (a transformers model)."""
    runner = ModelRunner(ModelConfig(model=str(model_dir), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=128), attn_ops=attn_ops)
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, seed=5,
                       num_groups=runner.kv_layout.num_groups)
    # Step 1: first half of every sequence; step 2: the rest (chunked prefill + decode).
    halves = [len(s) // 2 for s in seqs]
    runner.execute_model(maker.batch(
        [Chunk(str(i), s, 0, h) for i, (s, h) in enumerate(zip(seqs, halves)) if h]))
    got = runner.execute_model(maker.batch(
        [Chunk(str(i), s, h, len(s) - h) for i, (s, h) in enumerate(zip(seqs, halves))]))
    ref = torch.cat([hf_logits(hf, s)[h:] for s, h in zip(seqs, halves)])
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < ATOL
    return runner


def test_qwen2_with_qkv_bias_matches_hf(qwen2_dir, attn_ops):
    from transformers import Qwen2ForCausalLM

    assert (qwen2_dir / "model.safetensors.index.json").is_file()
    hf = Qwen2ForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32).eval()
    runner = _compare(qwen2_dir, hf, attn_ops)
    assert runner.model.lm_head is not runner.model.embed_tokens


def test_llama3_rope_scaling_matches_hf(llama3_dir, attn_ops):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(llama3_dir, dtype=torch.float32).eval()
    runner = _compare(llama3_dir, hf, attn_ops)
    assert runner.model.lm_head is runner.model.embed_tokens
    params = rope_parameters(runner.hf_config)
    assert params["rope_type"] == "llama3"
    ours = inverse_frequencies(16, params)
    torch.testing.assert_close(ours, hf.model.rotary_emb.inv_freq.float(), rtol=1e-6, atol=0)
    plain = inverse_frequencies(16, {"rope_type": "default", "rope_theta": 10000.0})
    assert (ours < plain).any() and (ours == plain).any()  # some scaled, some kept


def test_untied_model_without_lm_head_uses_embeddings(tmp_path, attn_ops):
    """A checkpoint without lm_head.weight falls back to the embedding matrix."""
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    cfg = LlamaConfig(**SMALL, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _compare(tmp_path, model.eval(), attn_ops, lengths=(5, 20))


def test_unsupported_architecture_lists_supported(tmp_path):
    from transformers import GPT2Config

    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2)
    cfg.architectures = ["GPT2LMHeadModel"]
    cfg.save_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4),
                    attn_ops=object())
    for arch in MODEL_CLASSES:
        assert arch in str(err.value)
    assert "GPT2LMHeadModel" in str(err.value)


def test_architecture_falls_back_to_model_type():
    from transformers import MistralConfig

    cfg = MistralConfig(**SMALL)
    cfg.architectures = None
    assert model_class(cfg).__name__ == "LlamaForCausalLM"


def test_unsupported_rope_type_raises(tmp_path, attn_ops, llama3_dir):
    cfg = json.loads((llama3_dir / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    cfg.pop("rope_scaling", None)
    for f in llama3_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope_type"):
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4),
                    attn_ops=attn_ops)


def test_mistral_sliding_window_matches_hf_past_the_window(tmp_path, attn_ops):
    """Logits over a chunked prefill longer than the window (64); the context is
    not capped at the window (tests/model/test_sliding_window.py: the engine)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(3)
    cfg = MistralConfig(**SMALL, sliding_window=64)
    model = MistralForCausalLM(cfg).float().eval()
    model.save_pretrained(tmp_path)
    runner = _compare(tmp_path, model, attn_ops, lengths=(150, 30, 1))
    assert runner.max_model_len == SMALL["max_position_embeddings"]


@pytest.mark.parametrize("damage", ["drop", "reshape"])
def test_missing_or_misshapen_weight_raises(tmp_path, qwen2_dir, damage):
    from safetensors.torch import save_file

    from paternoster.model.loader import iter_safetensors

    weights = dict(iter_safetensors(qwen2_dir))
    name = "model.layers.1.self_attn.k_proj.bias"
    if damage == "drop":
        del weights[name]
    else:
        weights[name] = weights[name][:-1]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((qwen2_dir / "config.json").read_text())
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4),
                    attn_ops=object())
