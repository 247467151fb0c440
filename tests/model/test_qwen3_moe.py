"""Qwen3-MoE (top-k routed SwiGLU experts, computed grouped by expert) against
HF transformers' own Qwen3MoeForCausalLM on tiny random-weight checkpoints:
float32 logits over a chunked prefill + decode, with and without top-k
renormalization, a dense layer among the sparse ones, and greedy ids equal to
HF ``generate``."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.moe import SparseMoeBlock
from paternoster.model.runner import ModelRunner

from .conftest import greedy_matches_hf_generate
from .test_tiny_models import SMALL, _compare

MOE = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, head_dim=16,
           pad_token_id=0)


def _moe(tmp_path_factory, seed: int, **kwargs):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 3}, **MOE, rope_theta=1000.0,
                         **kwargs)
    model = Qwen3MoeForCausalLM(cfg).float()
    with torch.no_grad():  # HF initializes the router to zeros: make the routing matter
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 1.0)
    path = tmp_path_factory.mktemp("qwen3moe")
    model.save_pretrained(path)
    return path, model.eval()


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_matches_hf_forward(tmp_path_factory, attn_ops, norm_topk_prob):
    path, hf = _moe(tmp_path_factory, 31 + norm_topk_prob, norm_topk_prob=norm_topk_prob,
                    mlp_only_layers=[1])
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    kinds = [type(layer.mlp).__name__ for layer in runner.model.layers]
    assert kinds == ["SparseMoeBlock", "LlamaMLP", "SparseMoeBlock"]


def test_qwen3_moe_routes_tokens_to_several_experts(tmp_path_factory):
    """The test model's routing is not degenerate: a 64-token step uses most
    experts, and each token exactly top_k of them."""
    path, _ = _moe(tmp_path_factory, 33)
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    moe = runner.model.layers[0].mlp
    assert isinstance(moe, SparseMoeBlock)
    x = torch.randn(64, SMALL["hidden_size"])
    weights, experts = moe.route(x)
    assert experts.shape == (64, 2) and len(set(experts.flatten().tolist())) >= 6
    assert all(len(set(row)) == 2 for row in experts.tolist())


def test_qwen3_moe_greedy_ids_equal_hf_generate(tmp_path_factory, attn_ops):
    path, hf = _moe(tmp_path_factory, 34)
    ours, ref = greedy_matches_hf_generate(path, hf, attn_ops, [5, 17, 33, 2, 90, 64, 7], 10)
    assert ours == ref


def test_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        SparseMoeBlock(8, 4, num_experts=4, top_k=5, norm_topk_prob=True,
                       dtype=torch.float32)


def test_one_token_alone_equals_its_row_in_a_batch():
    """The one-token path (decode of a single sequence) adds the same expert
    outputs in the same order as the grouped path: bit-identical rows with
    the batch-invariant linear kernels."""
    torch.manual_seed(5)
    block = SparseMoeBlock(32, 16, num_experts=8, top_k=3, norm_topk_prob=True,
                           dtype=torch.float32, invariant=True)
    for p in block.parameters():
        p.data.normal_(0, 0.5)
    x = torch.randn(6, 32)
    together = block(x)
    for i in range(6):
        assert torch.equal(block(x[i:i + 1])[0], together[i])
