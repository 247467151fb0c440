"""ModelRunner configuration: dtype, KV cache sizing, max_model_len, EOS."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

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
