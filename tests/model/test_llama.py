"""Our Llama forward on the default model (SmolLM2-135M) against HF transformers' own
forward, float32. Tolerance: max |logit difference| < 1e-3 (logits are O(10), measured
~6e-5: the two differ only in summation order)."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, hf_logits

ATOL = 1e-3
BLOCK_SIZE = 16

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Paged attention stores the KV cache in fixed-size blocks addressed through block "
    "tables, so many requests share memory without fragmentation. " * 2,
]


@pytest.fixture(scope="module")
def token_lists(default_model_path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    return [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_model(default_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runner(default_model_path, attn_ops) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=str(default_model_path), dtype="float32"),
        CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64),
        attn_ops=attn_ops,
    )


def test_batched_prefill_matches_hf_at_every_position(runner, hf_model, token_lists):
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, seed=1)
    chunks = [Chunk(f"s{i}", t, 0, len(t)) for i, t in enumerate(token_lists)]
    logits = runner.execute_model(maker.batch(chunks))
    assert logits.dtype == torch.float32
    ref = torch.cat([hf_logits(hf_model, t) for t in token_lists])
    assert logits.shape == ref.shape == (sum(map(len, token_lists)), runner.vocab_size)
    assert (logits - ref).abs().max().item() < ATOL


def test_mixed_batch_of_prefill_chunk_and_decodes_matches_hf(runner, hf_model, token_lists):
    """Step 1 prefills A's first chunk and C, D whole; step 2 mixes B's full prompt,
    A's second chunk (after cached context, crossing block boundaries) and one decode
    token each for C and D."""
    a, b, c, d = token_lists
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, seed=2)
    cut = 13
    step1 = [Chunk("a", a, 0, cut), Chunk("c", c, 0, len(c) - 1), Chunk("d", d, 0, len(d) - 1)]
    runner.execute_model(maker.batch(step1, all_logits=False))
    step2 = [
        Chunk("b", b, 0, len(b)),
        Chunk("a", a, cut, len(a) - cut),
        Chunk("c", c, len(c) - 1, 1),
        Chunk("d", d, len(d) - 1, 1),
    ]
    logits = runner.execute_model(maker.batch(step2))
    ref = torch.cat([
        hf_logits(hf_model, b),
        hf_logits(hf_model, a)[cut:],
        hf_logits(hf_model, c)[-1:],
        hf_logits(hf_model, d)[-1:],
    ])
    assert logits.shape == ref.shape
    assert (logits - ref).abs().max().item() < ATOL


def test_logits_indices_select_last_tokens(runner, hf_model, token_lists):
    maker = BatchMaker(runner.num_kv_blocks, BLOCK_SIZE, seed=3)
    chunks = [Chunk(f"s{i}", t, 0, len(t)) for i, t in enumerate(token_lists[:2])]
    logits = runner.execute_model(maker.batch(chunks, all_logits=False))
    ref = torch.stack([hf_logits(hf_model, t)[-1] for t in token_lists[:2]])
    assert logits.shape == (2, runner.vocab_size)
    assert (logits - ref).abs().max().item() < ATOL


def test_bfloat16_greedy_tokens_agree_with_float32(default_model_path, attn_ops, runner,
                                                   token_lists):
    """bf16 (the checkpoint dtype, ``auto``) stays close to float32: the same argmax
    at >= 90% of positions and small logit differences on average."""
    bf16 = ModelRunner(ModelConfig(model=str(default_model_path)),
                       CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=64), attn_ops=attn_ops)
    assert bf16.dtype == torch.bfloat16
    chunks = [Chunk(f"s{i}", t, 0, len(t)) for i, t in enumerate(token_lists)]
    got = bf16.execute_model(BatchMaker(64, BLOCK_SIZE).batch(chunks))
    ref = runner.execute_model(BatchMaker(64, BLOCK_SIZE).batch(chunks))
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9
    assert (got - ref).abs().mean().item() < 0.3
