"""SmolLM3 (no RoPE in every fourth layer) against HF transformers' own
SmolLM3ForCausalLM on a tiny random-weight checkpoint: float32 logits over a
chunked prefill + decode on both CPU paths, and the core's decoder stack
bit-identical to the Python layers in bfloat16."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

from .conftest import stack_and_python_logits
from .test_tiny_models import SMALL, _compare

LAYERS = 4  # layer 3 is a NoPE layer (no_rope_layer_interval 4)


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(21)
    cfg = SmolLM3Config(**{**SMALL, "num_hidden_layers": LAYERS}, rope_theta=1000.0, pad_token_id=0,
                        tie_word_embeddings=True)
    assert cfg.no_rope_layers == [1, 1, 1, 0]
    path = tmp_path_factory.mktemp("smollm3")
    model = SmolLM3ForCausalLM(cfg).float()
    model.save_pretrained(path)
    return path, model.eval()


@pytest.mark.parametrize("fused", [True, False], ids=["decoder-stack", "python-layers"])
def test_smollm3_matches_hf_forward(smollm3, attn_ops, monkeypatch, fused):
    from paternoster.model.smollm3 import SmolLM3ForCausalLM

    monkeypatch.setattr(SmolLM3ForCausalLM, "fused_steps", fused)
    path, hf = smollm3
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    assert [layer.self_attn.use_rope for layer in runner.model.layers] == [True, True, True,
                                                                           False]


def test_smollm3_decoder_stack_is_bit_identical_to_python_layers(smollm3):
    logits = stack_and_python_logits(smollm3[0], SMALL["vocab_size"])
    assert torch.equal(logits[True], logits[False])


def test_smollm3_bad_no_rope_layers_are_refused(smollm3, tmp_path):
    import json

    path, _ = smollm3
    for change, match in (({"no_rope_layers": [1, 1]}, "no_rope_layers"),):
        cfg = json.loads((path / "config.json").read_text())
        cfg.update(change)
        d = tmp_path / match
        d.mkdir()
        for f in path.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ValueError, match=match):
            ModelRunner(ModelConfig(model=str(d)), CacheConfig(num_kv_blocks=4))
