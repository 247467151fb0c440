"""The Llama decoder's one forward path: the whole model matches HF
transformers' forward over prefill chunks and decodes, one decoder layer's
carried residual stream adds up to the textbook pre-norm block (written here
with the torch reference ops), and a position past the RoPE table is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import paternoster.model.llama as llama
from paternoster.config import CacheConfig, ModelConfig
from paternoster.kernels.native import rms_norm_torch, silu_and_mul_torch
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, hf_logits

BLOCK_SIZE = 8
SMALL = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(**SMALL, tie_word_embeddings=False, rope_theta=10000.0)
    path = tmp_path_factory.mktemp("tiny-llama")
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # norm weights are initialised to 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)
    model.save_pretrained(path)
    return path


def _runner(model_dir, attn_ops, dtype="float32"):
    return ModelRunner(ModelConfig(model=str(model_dir), dtype=dtype),
                       CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=128), attn_ops=attn_ops)


def test_model_matches_hf_over_prefill_chunks_and_decodes(tiny_dir, attn_ops):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    runner = _runner(tiny_dir, attn_ops)
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist()
            for n in (1, 37, 90)]
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, seed=5)
    halves = [len(s) // 2 for s in seqs]
    runner.execute_model(maker.batch(
        [Chunk(str(i), s, 0, h) for i, (s, h) in enumerate(zip(seqs, halves)) if h]))
    got = runner.execute_model(maker.batch(
        [Chunk(str(i), s, h, len(s) - h) for i, (s, h) in enumerate(zip(seqs, halves))]))
    ref = torch.cat([hf_logits(hf, s)[h:] for s, h in zip(seqs, halves)])
    assert (got - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoder_layer_carries_the_residual_stream_of_the_pre_norm_block(tiny_dir, attn_ops,
                                                                         dtype):
    """The layer returns (mlp_out, residual) whose sum is
    ``h + mlp(norm(h))`` with ``h = x + attn(norm(x))``, up to SiLU-and-mul's
    single rounding; the stream is carried in the caller's tensor."""
    runner = _runner(tiny_dir, attn_ops, str(dtype).removeprefix("torch."))
    model = runner.model
    t = 9
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(t, SMALL["hidden_size"], generator=gen).to(dtype)
    positions = torch.arange(t) + 3
    batch = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE).batch([Chunk("a", [0] * t, 0, t)])
    attn = llama.AttentionMetadata(
        slot_mapping=torch.from_numpy(batch["slot_mapping"]),
        block_tables=torch.from_numpy(batch["block_tables"]),
        seq_lens=torch.from_numpy(batch["seq_lens"]),
        query_start_loc=torch.from_numpy(batch["query_start_loc"]))
    layer, kv = model.layers[1], runner.kv_caches[1]
    rope = llama.Rope(model.rotary, positions)
    eps = layer.input_layernorm.eps
    h = layer.self_attn(rope, rms_norm_torch(x, layer.input_layernorm.weight, eps), kv,
                        attn) + x
    mlp = layer.mlp
    gate_up = F.linear(rms_norm_torch(h, layer.post_attention_layernorm.weight, eps),
                       mlp.gate_up_weight)
    want = F.linear(silu_and_mul_torch(gate_up), mlp.down_weight) + h

    residual_in = x.clone()
    out, residual = layer(rope, residual_in, None, kv, attn)
    assert residual is residual_in
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out + residual, want, atol=tol, rtol=tol)


def test_positions_past_the_rope_table_raise(tiny_dir, attn_ops):
    runner = _runner(tiny_dir, attn_ops)
    batch = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE).batch([Chunk("a", [1, 2], 0, 2)])
    batch["positions"][1] = 10**6
    with pytest.raises(ValueError, match="positions"):
        runner.execute_model(batch)
