"""Ministral 3 (YaRN RoPE and Llama 4's attention temperature) against HF
transformers' ``Ministral3ForCausalLM`` and the text tower of
``Mistral3ForConditionalGeneration`` on tiny random-weight checkpoints:
float32 logits over a chunked prefill and a batched decode whose positions
reach past ``original_max_position_embeddings`` (where the temperature is
above 1), greedy ids through the engine (5-token prefill chunks, a
prefix-cache hit, a preemption), and the core's decoder stack bit-identical
to the Python layers below that position."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

from .conftest import stack_and_python_logits
from .test_post_norm_models import (
    preemption_gives_hf_generate_ids,
    prefix_hit_gives_hf_generate_ids,
)
from .test_tiny_models import SMALL, _compare


def _text_config(original: int):
    from transformers import Ministral3Config

    rope = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
            "original_max_position_embeddings": original, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
    return Ministral3Config(**{**SMALL, "max_position_embeddings": 4 * original}, head_dim=16,
                            rope_parameters=rope, pad_token_id=0)


def _save(model, path):
    with torch.no_grad():  # sharper logits than the 0.02 init: fewer near-ties
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08)
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def ministral3(tmp_path_factory):
    """The temperature starts at position 16: 1 + 0.1 ln 2 from 16, 1 + 0.1 ln 3 from 32."""
    from transformers import Ministral3ForCausalLM

    torch.manual_seed(150)
    return _save(Ministral3ForCausalLM(_text_config(16)).float(),
                 tmp_path_factory.mktemp("ministral3"))


def test_ministral3_matches_hf_forward_past_the_original_context(ministral3, attn_ops):
    path, hf = ministral3
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    assert runner.model.temperature == (0.1, 16)


def test_ministral3_engine_gives_hf_generate_ids(ministral3):
    path, hf = ministral3
    prefix_hit_gives_hf_generate_ids(path, hf)
    preemption_gives_hf_generate_ids(path, hf, blocks=12)


def test_ministral3_decoder_stack_is_bit_identical_below_the_original_context(tmp_path):
    """With L = 64 every position of the helper's steps has factor 1: the
    core's stack runs them and gives the Python layers' bits."""
    from transformers import Ministral3ForCausalLM

    torch.manual_seed(151)
    path, _ = _save(Ministral3ForCausalLM(_text_config(64)).float(), tmp_path)
    logits = stack_and_python_logits(path, SMALL["vocab_size"])
    assert torch.equal(logits[True], logits[False])


def test_mistral3_text_tower_is_served(tmp_path, attn_ops):
    """A Mistral3ForConditionalGeneration checkpoint (vision tower and
    projector saved too) serves its ministral3 text tower: HF's logits for a
    text-only prompt."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, PixtralVisionConfig

    torch.manual_seed(152)
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, image_size=32, patch_size=16,
                                 head_dim=16)
    cfg = Mistral3Config(vision_config=vision, text_config=_text_config(16), image_token_index=5,
                         spatial_merge_size=1)
    path, hf = _save(Mistral3ForConditionalGeneration(cfg).float(), tmp_path / "m3")
    runner = _compare(path, hf, attn_ops, lengths=(1, 30, 21))
    assert type(runner.model).__name__ == "Ministral3ForCausalLM"


def test_quantized_checkpoints_are_refused_naming_the_method(ministral3, tmp_path):
    """An FP8 checkpoint's scales are not read: refused, not served as garbage."""
    import json

    path, _ = ministral3
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quant_method 'fp8' is not supported for "
                                         "Ministral3ForCausalLM"):
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4))


@pytest.mark.parametrize(("text_config", "match"), [
    (None, "needs a text_config"),
    ({"model_type": "nonsense"}, "text_config.model_type 'nonsense' is not supported; "
                                 "supported: ministral3, mistral$"),
])
def test_mistral3_text_tower_problems_are_one_line_errors(tmp_path, text_config, match):
    import json

    cfg = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3"}
    if text_config is not None:
        cfg["text_config"] = text_config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match) as e:
        ModelRunner(ModelConfig(model=str(tmp_path)), CacheConfig(num_kv_blocks=4))
    assert "\n" not in str(e.value)
