"""ModelRunner configuration: dtype, KV cache sizing, max_model_len, EOS."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.interface import ModelInput
from paternoster.model.runner import ModelRunner
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams

from .conftest import BatchMaker, Chunk

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims.
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64


def _runner(path, attn_ops, dtype="auto", max_model_len=None, **cache):
    return ModelRunner(ModelConfig(model=str(path), dtype=dtype, max_model_len=max_model_len),
                       CacheConfig(**cache), attn_ops=attn_ops)


def test_auto_dtype_is_checkpoint_bfloat16_and_metadata(default_model_path, attn_ops):
    r = _runner(default_model_path, attn_ops, num_kv_blocks=8, block_size=16)
    assert r.dtype == torch.bfloat16
    assert r.model_dir == default_model_path
    assert (r.vocab_size, r.eos_token_id, r.block_size, r.num_kv_blocks) == (49152, 2, 16, 8)
    assert r.max_model_len == 8 * 16  # capped by the cache
    assert len(r.kv_caches) == LAYERS
    for k, v in r.kv_caches:
        assert k.shape == v.shape == (8, 16, KV_HEADS, HEAD_DIM)
        assert k.dtype == torch.bfloat16


def test_num_blocks_from_memory_budget(default_model_path, attn_ops):
    per_block = 2 * LAYERS * 8 * KV_HEADS * HEAD_DIM * 4  # K and V, float32
    r = _runner(default_model_path, attn_ops, dtype="float32", block_size=8,
                kv_cache_memory=10 * per_block + per_block // 2)
    assert r.bytes_per_block() == per_block
    assert r.num_kv_blocks == 10
    assert r.max_model_len == 80


def test_max_model_len_defaults_to_max_position_embeddings(default_model_path, attn_ops):
    r = _runner(default_model_path, attn_ops, num_kv_blocks=1024, block_size=16)
    assert r.max_model_len == 8192
    r = _runner(default_model_path, attn_ops, max_model_len=300, num_kv_blocks=1024)
    assert r.max_model_len == 300


def test_max_model_len_above_model_limit_raises(default_model_path, attn_ops):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        _runner(default_model_path, attn_ops, max_model_len=9000, num_kv_blocks=8)


def test_too_small_cache_budget_raises(default_model_path, attn_ops):
    with pytest.raises(ValueError, match="kv_cache_memory"):
        _runner(default_model_path, attn_ops, kv_cache_memory=1000)


def test_float16_on_cpu_raises(default_model_path, attn_ops):
    with pytest.raises(ValueError, match="float16"):
        _runner(default_model_path, attn_ops, dtype="float16", num_kv_blocks=8)


def test_execute_model_samples_from_the_forward_pass(default_model_path, attn_ops):
    """Request a's whole prompt and b's first 12 tokens in one step: only a
    samples, greedily the argmax of :meth:`compute_logits`' row, with the
    log_softmax of that row as its logprob. A bare batch dict (transitional)
    still gets the logits."""
    r = _runner(default_model_path, attn_ops, dtype="float32", num_kv_blocks=8, block_size=16)
    ids_a, ids_b = list(range(100, 110)), list(range(200, 220))
    batch = BatchMaker(8, 16, seed=1).batch([Chunk("a", ids_a, 0, 10), Chunk("b", ids_b, 0, 12)],
                                            all_logits=False)  # fmt: skip
    logits = r.compute_logits(batch)
    assert logits.shape == (2, r.vocab_size)
    torch.testing.assert_close(r.execute_model(batch), logits)
    reqs = [Request("a", ids_a, SamplingParams(temperature=0.0, logprobs=1)),
            Request("b", ids_b, SamplingParams(temperature=0.0))]  # fmt: skip
    step = ModelInput(
        requests=reqs, preempted=[],
        arrays={**batch, "logits_indices": batch["logits_indices"][:1]},
        num_computed_tokens=np.zeros(2, np.int32),
        num_scheduled_tokens=np.array([10, 12], np.int32), sample_rows=np.array([0]),
    )  # fmt: skip
    out = r.execute_model(step)
    assert out.sampled_token_ids == {0: int(logits[0].argmax())}
    log_probs = torch.log_softmax(logits[0], dim=-1)
    assert out.logprobs["a"].token_logprobs == pytest.approx([float(log_probs.max())], abs=1e-5)
    assert out.logprobs["a"].top_token_ids == [[int(logits[0].argmax())]]
    assert out.prompt_logprobs == {}
