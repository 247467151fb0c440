"""Mixtral (routed experts under Mixtral's checkpoint names, top-2 weights
renormalized) against HF transformers' own MixtralForCausalLM on a tiny
random-weight checkpoint: float32 logits over a chunked prefill + decode."""

from __future__ import annotations

import torch

from paternoster.model.moe import SparseMoeBlock

from .test_tiny_models import SMALL, _compare


def test_mixtral_matches_hf_forward(tmp_path, attn_ops):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(51)
    cfg = MixtralConfig(**{**SMALL, "intermediate_size": 32}, num_local_experts=4,
                        num_experts_per_tok=2, rope_theta=1000.0, pad_token_id=0)
    hf = MixtralForCausalLM(cfg).float()
    with torch.no_grad():  # a router that spreads tokens over the experts
        for layer in hf.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)
    hf.save_pretrained(tmp_path)
    runner = _compare(tmp_path, hf.eval(), attn_ops, lengths=(1, 37, 50, 9))
    assert all(isinstance(layer.mlp, SparseMoeBlock) for layer in runner.model.layers)
