"""Phi-3 (fused qkv_proj / gate_up_proj in the checkpoint, untied head)
against HF transformers' own Phi3ForCausalLM on a tiny random-weight
checkpoint: float32 logits over a chunked prefill + decode on both CPU paths.
LongRoPE and partial rotation (Phi-3.5, Phi-4-mini): test_phi3_longrope.py."""

from __future__ import annotations

import pytest
import torch

from .test_tiny_models import SMALL, _compare


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(41)
    cfg = Phi3Config(**SMALL, rope_theta=1000.0, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2)
    model = Phi3ForCausalLM(cfg).float()
    path = tmp_path_factory.mktemp("phi3")
    model.save_pretrained(path)
    return path, model.eval()


@pytest.mark.parametrize("fused", [True, False], ids=["decoder-stack", "python-layers"])
def test_phi3_matches_hf_forward(phi3, attn_ops, monkeypatch, fused):
    from safetensors import safe_open

    from paternoster.model.phi3 import Phi3ForCausalLM

    path, hf = phi3
    with safe_open(path / "model.safetensors", "pt") as f:  # the fused names are loaded
        assert "model.layers.0.self_attn.qkv_proj.weight" in f.keys()
        assert "model.layers.0.mlp.gate_up_proj.weight" in f.keys()
    monkeypatch.setattr(Phi3ForCausalLM, "fused_steps", fused)
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    assert runner.model.lm_head is not runner.model.embed_tokens
