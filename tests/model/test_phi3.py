"""Phi-3 (fused qkv_proj / gate_up_proj in the checkpoint, untied head)
against HF transformers' own Phi3ForCausalLM on a tiny random-weight
checkpoint: float32 logits over a chunked prefill + decode on both CPU paths;
LongRoPE and partial rotation refused with the reason."""

from __future__ import annotations

import json

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

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


@pytest.mark.parametrize("change,match", [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                          "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                          "original_max_position_embeddings": 128}}, "rope_type 'longrope'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                          "partial_rotary_factor": 0.75}}, "partial_rotary_factor"),
])
def test_phi3_longrope_and_partial_rotation_are_refused(phi3, tmp_path, change, match):
    path, _ = phi3
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("rope_scaling", None)
    cfg.pop("partial_rotary_factor", None)
    cfg.update(change)
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4))
