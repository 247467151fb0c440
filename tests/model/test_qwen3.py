"""Qwen3 (per-head q/k RMSNorm, explicit head_dim) against HF transformers'
own Qwen3ForCausalLM on tiny random-weight checkpoints: float32 logits over a
chunked prefill + decode, greedy ids equal to HF ``generate``, and the core's
decoder stack bit-identical to the Python layers in bfloat16."""

from __future__ import annotations

import pytest
import torch

from .conftest import greedy_matches_hf_generate, stack_and_python_logits
from .test_tiny_models import SMALL, _compare


def _qwen3(tmp_path_factory, seed: int, **kwargs):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    # head_dim 24 != hidden / heads (16): Qwen3 sets it explicitly.
    cfg = Qwen3Config(**SMALL, head_dim=24, rope_theta=1000.0, **kwargs)
    model = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():  # q/k norm weights away from 1, so that they matter
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path)
    return path, model.eval()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return _qwen3(tmp_path_factory, 11, tie_word_embeddings=True)


@pytest.mark.parametrize("fused", [True, False], ids=["decoder-stack", "python-layers"])
def test_qwen3_matches_hf_forward(qwen3, attn_ops, monkeypatch, fused):
    """Both CPU paths: the core's decoder stack (steps it takes) and the
    Python layers."""
    from paternoster.model.qwen3 import Qwen3ForCausalLM

    monkeypatch.setattr(Qwen3ForCausalLM, "fused_steps", fused)
    path, hf = qwen3
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    assert type(runner.model).__name__ == "Qwen3ForCausalLM"
    assert runner.model.lm_head is runner.model.embed_tokens


def test_qwen3_untied_matches_hf_forward(tmp_path_factory, attn_ops):
    path, hf = _qwen3(tmp_path_factory, 12, tie_word_embeddings=False)
    runner = _compare(path, hf, attn_ops, lengths=(3, 40))
    assert runner.model.lm_head is not runner.model.embed_tokens


def test_qwen3_greedy_ids_equal_hf_generate(qwen3, attn_ops):
    """Greedy decoding one token per step through the paged cache gives HF
    ``generate``'s ids."""
    path, hf = qwen3
    ours, ref = greedy_matches_hf_generate(path, hf, attn_ops, [5, 17, 33, 2, 90, 64, 7], 12)
    assert ours == ref


def test_qwen3_decoder_stack_is_bit_identical_to_python_layers(qwen3):
    """bfloat16 decode steps through the core's decoder stack (q/k norm in C++)
    give the Python layers' bits."""
    logits = stack_and_python_logits(qwen3[0], SMALL["vocab_size"])
    assert torch.equal(logits[True], logits[False])
