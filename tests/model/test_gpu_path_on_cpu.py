"""The GPU model path's device-independent parts, run on the CPU: the eager
CUDA execute path (host-side kernel hints, logits rows) against the CPU path,
the CUDA-graph batch padding helpers, dummy weights, dtype rules and the GPU
config fields and flags."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.entrypoints.engine_args import build_engine_config
from paternoster.model import cuda_graphs
from paternoster.model.loader import resolve_dtype
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk

TINY = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=96, hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
    tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def dummy_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dummy-llama")
    (d / "config.json").write_text(json.dumps(TINY))
    return d


def _runner(model_dir, attn_ops):
    return ModelRunner(ModelConfig(model=str(model_dir), dtype="float32", load_format="dummy"),
                       CacheConfig(block_size=8, num_kv_blocks=64), attn_ops=attn_ops)


def test_dummy_weights_need_only_a_config(dummy_dir, attn_ops):
    runner = _runner(dummy_dir, attn_ops)
    model = runner.model
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))
    w = model.layers[0].mlp.down_weight
    assert 0.01 < float(w.std()) < 0.03
    maker = BatchMaker(runner.num_kv_blocks, 8, seed=1)
    logits = runner.execute_model(maker.batch([Chunk("a", list(range(10)), 0, 10)]))
    assert logits.shape[1] == TINY["vocab_size"] and torch.isfinite(logits).all()


def test_eager_cuda_path_matches_the_cpu_path(dummy_dir, attn_ops):
    """_execute_cuda with kernel hints (the CPU kernels ignore them) gives the
    same logits as the CPU execute path, over a prefill step and a mixed step."""
    a, b = _runner(dummy_dir, attn_ops), _runner(dummy_dir, attn_ops)
    b.model.load_state_dict(a.model.state_dict())
    b._kernel_hints = True
    seqs = [list(range(1, 30)), list(range(40, 45)), list(range(50, 90))]
    steps = [[Chunk(str(i), s, 0, len(s) - 1) for i, s in enumerate(seqs)],
             [Chunk(str(i), s, len(s) - 1, 1) for i, s in enumerate(seqs)]]
    for chunks in steps:
        batch = BatchMaker(a.num_kv_blocks, 8, seed=2).batch(chunks)
        want = a.execute_model(batch)
        got = b._execute_cuda(batch)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_capture_sizes_cover_every_batch_up_to_the_maximum():
    sizes = cuda_graphs.capture_sizes(256)
    assert sizes[0] == 1 and sizes[-1] == 256 and sizes == sorted(set(sizes))
    assert cuda_graphs.capture_sizes(100)[-1] == 100
    assert cuda_graphs.capture_sizes(1) == [1]


def test_graphs_run_only_pure_decode_batches_that_fit():
    graphs = object.__new__(cuda_graphs.DecodeGraphs)
    graphs.sizes, graphs.max_blocks = [1, 2, 4, 8], 16
    assert graphs.can_run(num_tokens=5, num_seqs=5, max_query_len=1, table_width=16)
    assert not graphs.can_run(num_tokens=6, num_seqs=5, max_query_len=2, table_width=3)
    assert not graphs.can_run(num_tokens=9, num_seqs=9, max_query_len=1, table_width=3)
    assert not graphs.can_run(num_tokens=3, num_seqs=3, max_query_len=1, table_width=17)
    assert not graphs.can_run(num_tokens=0, num_seqs=0, max_query_len=0, table_width=1)


def test_graph_inputs_are_padded_as_empty_decode_rows():
    dst = torch.full((8,), 5, dtype=torch.int64)
    cuda_graphs.DecodeGraphs._fill(dst, np.array([10, 11, 12]), 4, -1, np.int64)
    assert dst.tolist() == [10, 11, 12, -1, 5, 5, 5, 5]


def test_dtype_rules_per_device():
    class Cfg:
        torch_dtype = "float32"

    assert resolve_dtype(Cfg(), "auto", "cuda") == torch.bfloat16
    assert resolve_dtype(Cfg(), "auto", "cpu") == torch.float32
    assert resolve_dtype(Cfg(), "float16", "cuda") == torch.float16
    with pytest.raises(ValueError, match="float32 is not supported on CUDA"):
        resolve_dtype(Cfg(), "float32", "cuda")


def test_gpu_flags_reach_the_config():
    cfg = build_engine_config("/m", device="cuda:1", gpu_memory_utilization=0.8,
                              cuda_graphs=True, load_format="dummy")
    assert (cfg.model.device, cfg.model.cuda_graphs, cfg.model.load_format) == (
        "cuda:1", True, "dummy")
    assert cfg.cache.gpu_memory_utilization == 0.8
    assert type(cfg).from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("kwargs, field", [
    ({"device": "tpu"}, "device"), ({"device": "cpu:0"}, "device"),
    ({"device": "cuda:x"}, "device"), ({"load_format": "gguf"}, "load_format"),
])  # fmt: skip
def test_model_config_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(model="/m", **kwargs)


@pytest.mark.parametrize("value", [0.0, 1.5, -0.1])
def test_gpu_memory_utilization_must_be_a_fraction(value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=value)


def test_cuda_device_without_a_gpu_is_refused(dummy_dir, attn_ops):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        ModelRunner(ModelConfig(model=str(dummy_dir), device="cuda", load_format="dummy"),
                    CacheConfig(block_size=16), attn_ops=attn_ops)
