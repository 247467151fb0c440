"""The core's decoder stack (``paternoster/decoder.h``, used for CPU steps
whose matmuls all run in the core) against the Python layers it replaces:
the same logits bit for bit, on dense float32/bfloat16 models at decode sizes
and on a quantized GGUF model at every step size, and the Python layers
against HF transformers (tests/model/test_tiny_models.py) close the loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import paternoster.model.llama as llama
from paternoster import kernels
from paternoster.config import CacheConfig, ModelConfig
from paternoster.kernels.cpu import DENSE_CORE_MAX_TOKENS
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk
from .gguf_writer import write_llama_gguf

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False)).float()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=True)).float()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(model, path, "q4_1")
    return path


def _steps(model_path, dtype: str, fused: bool, steps: list[list[Chunk]],
           batch_invariant: bool = False) -> list[torch.Tensor]:
    runner = ModelRunner(ModelConfig(model=str(model_path), dtype=dtype,
                                     batch_invariant=batch_invariant),
                         CacheConfig(block_size=8, num_kv_blocks=96))
    runner.model.fused_steps = fused
    maker = BatchMaker(96, 8, seed=3)
    return [runner.compute_logits(maker.batch(chunks)) for chunks in steps]


def _decode_plan(prompts: dict[str, list[int]], prefill: int) -> list[list[Chunk]]:
    """Prefill ``prefill`` tokens of each prompt one prompt a step, then
    decode steps of one token per sequence (all sequences together)."""
    plan = [[Chunk(s, toks, 0, prefill)] for s, toks in prompts.items()]
    for i in range(prefill, len(next(iter(prompts.values())))):
        plan.append([Chunk(s, toks, i, 1) for s, toks in prompts.items()])
    return plan


def _prompts(n: int, length: int, seed: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(seed)
    return {f"s{i}": torch.randint(3, 128, (length,), generator=g).tolist() for i in range(n)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dense_decode_steps_match_python_layers_bitwise(hf_dir, dtype):
    plan = _decode_plan(_prompts(3, 30, 0), prefill=20)  # decode steps of 3 tokens
    fused = _steps(hf_dir, dtype, True, plan)
    python = _steps(hf_dir, dtype, False, plan)
    for i, (a, b) in enumerate(zip(fused, python, strict=True)):
        assert torch.equal(a, b), f"step {i}"


def test_quantized_model_matches_at_every_step_size(gguf_path):
    """All weights quantized: the stack runs prefill steps too."""
    plan = _decode_plan(_prompts(2, 26, 1), prefill=21)
    plan.append([Chunk("x", list(range(3, 40)), 0, 37)])  # a long prefill next to nothing
    fused = _steps(gguf_path, "bfloat16", True, plan)
    python = _steps(gguf_path, "bfloat16", False, plan)
    for i, (a, b) in enumerate(zip(fused, python, strict=True)):
        assert torch.equal(a, b), f"step {i}"


def test_moe_model_matches_at_every_step_size(tmp_path):
    """A Qwen3-MoE GGUF: the stack runs its routed experts (one core call a
    layer, paternoster/moe.h) where the Python layers call the same block."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(4)
    cfg = Qwen3MoeConfig(**TINY, head_dim=16, moe_intermediate_size=32, num_experts=6,
                         num_experts_per_tok=2, norm_topk_prob=True, rope_theta=10000.0)
    hf = Qwen3MoeForCausalLM(cfg).float()
    with torch.no_grad():  # HF initializes the router to zeros: make the routing matter
        for layer in hf.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0)
    path = tmp_path / "tiny-qwen3moe.gguf"
    write_llama_gguf(hf, path, "q8_0", arch="qwen3moe")
    plan = _decode_plan(_prompts(2, 26, 2), prefill=21)
    plan.append([Chunk("x", list(range(3, 40)), 0, 37)])
    runner = ModelRunner(ModelConfig(model=str(path), dtype="bfloat16"),
                         CacheConfig(block_size=8, num_kv_blocks=96))
    assert runner.model._decoder_stack(37, runner.kv_caches) is not None
    fused = _steps(path, "bfloat16", True, plan)
    python = _steps(path, "bfloat16", False, plan)
    for i, (a, b) in enumerate(zip(fused, python, strict=True)):
        assert torch.equal(a, b), f"step {i}"


def test_batch_invariant_prefill_matches(hf_dir):
    plan = [[Chunk("a", list(range(3, 50)), 0, 30), Chunk("b", list(range(60, 75)), 0, 15)]]
    fused = _steps(hf_dir, "bfloat16", True, plan, batch_invariant=True)
    python = _steps(hf_dir, "bfloat16", False, plan, batch_invariant=True)
    assert torch.equal(fused[0], python[0])


def test_stack_is_used_only_where_the_core_runs_every_matmul(hf_dir):
    runner = ModelRunner(ModelConfig(model=str(hf_dir), dtype="bfloat16"),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    model = runner.model
    assert model._decoder_stack(DENSE_CORE_MAX_TOKENS, runner.kv_caches) is not None
    assert model._decoder_stack(DENSE_CORE_MAX_TOKENS + 1, runner.kv_caches) is None


def test_bad_positions_raise_value_error(hf_dir):
    runner = ModelRunner(ModelConfig(model=str(hf_dir), dtype="float32"),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    batch = BatchMaker(32, 8).batch([Chunk("a", [5, 6], 0, 2)])
    batch["positions"][1] = 10_000  # outside the RoPE table
    with pytest.raises(ValueError, match="positions"):
        runner.compute_logits(batch)


# ------------------------------------------------------------------ sliding window

WINDOW = 6  # below the block size (8) and the 20-token prompts


class _WindowedKernels:
    """The kernels module as a layer's attention ops with a sliding window:
    what ``paged_attention_layer(..., sliding_window=WINDOW)`` calls."""

    reshape_and_cache = staticmethod(kernels.reshape_and_cache)

    @staticmethod
    def paged_attention(*args, **kwargs):
        return kernels.paged_attention(*args, **kwargs, sliding_window=WINDOW)


def _windowed_steps(model_path, dtype: str, fused: bool, steps: list[list[Chunk]],
                    monkeypatch, batch_invariant: bool = False) -> list[torch.Tensor]:
    """Like :func:`_steps`, with layer 1 windowed: in the Python layers through
    its attention ops, in the core's stack through its StackLayer (a fused
    run's steps too large for the stack take the Python layers)."""
    runner = ModelRunner(ModelConfig(model=str(model_path), dtype=dtype,
                                     batch_invariant=batch_invariant),
                         CacheConfig(block_size=8, num_kv_blocks=96))
    model = runner.model
    model.fused_steps = fused
    windowed = model.layers[1]
    windowed.self_attn.ops = _WindowedKernels()
    if fused:
        plain = llama._stack_layer

        def stack_layer(layer, cache):
            s = plain(layer, cache)
            return dataclasses.replace(s, sliding_window=WINDOW) if layer is windowed else s

        monkeypatch.setattr(llama, "_stack_layer", stack_layer)
    maker = BatchMaker(96, 8, seed=3)
    logits = [runner.compute_logits(maker.batch(chunks)) for chunks in steps]
    assert (model._decoder_stack(1, runner.kv_caches) is not None) == fused
    return logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stack_with_a_windowed_layer_matches_python_layers_bitwise(hf_dir, dtype, monkeypatch):
    plan = _decode_plan(_prompts(3, 30, 0), prefill=20)
    fused = _windowed_steps(hf_dir, dtype, True, plan, monkeypatch)
    python = _windowed_steps(hf_dir, dtype, False, plan, monkeypatch)
    plain = _steps(hf_dir, dtype, False, plan)
    for i, (a, b) in enumerate(zip(fused, python, strict=True)):
        assert torch.equal(a, b), f"step {i}"
    # The window took effect: past W tokens the logits leave full attention's.
    assert torch.equal(fused[0][:WINDOW], plain[0][:WINDOW])  # the window holds all
    assert not torch.allclose(fused[0][WINDOW:], plain[0][WINDOW:], atol=1e-3)
    assert not torch.allclose(fused[-1], plain[-1], atol=1e-3)


def test_stack_with_a_windowed_layer_batch_invariant(hf_dir, monkeypatch):
    plan = [[Chunk("a", list(range(3, 50)), 0, 30), Chunk("b", list(range(60, 75)), 0, 15)]]
    fused = _windowed_steps(hf_dir, "bfloat16", True, plan, monkeypatch, batch_invariant=True)
    python = _windowed_steps(hf_dir, "bfloat16", False, plan, monkeypatch, batch_invariant=True)
    assert torch.equal(fused[0], python[0])


def test_stack_layer_rejects_a_negative_window(hf_dir):
    runner = ModelRunner(ModelConfig(model=str(hf_dir), dtype="float32"),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    layer = llama._stack_layer(runner.model.layers[0], runner.kv_caches[0])
    with pytest.raises(ValueError, match="sliding_window"):
        dataclasses.replace(layer, sliding_window=-1)
