"""Phi-3 with LongRoPE (Phi-3-128k, Phi-3.5-mini) and Phi-4-mini (LongRoPE
over 3/4 of each head, tied embeddings) against HF transformers' own
Phi3ForCausalLM, on tiny random-weight checkpoints with
``original_max_position_embeddings`` L = 32 and ``max_position_embeddings``
128 (so the attention factor is sqrt(1 + ln 4 / ln 32)).

What is claimed (paternoster.model.longrope): one factor set per engine,
long when ``max_model_len`` > L. So with ``max_model_len`` 128 every logit is
HF's for a sequence longer than L, including the positions before L and
chunks that lie wholly before L; with ``max_model_len`` L every logit is
HF's short-factor one; a request crossing L mid-decode matches HF's forward
at every step past L and, before it, HF's forward with the long set, which
differs from HF's default there."""

from __future__ import annotations

import json

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.rope import RotaryEmbedding, rope_parameters
from paternoster.model.runner import ModelRunner

from .conftest import BatchMaker, Chunk, greedy_matches_hf_generate, hf_logits
from .test_tiny_models import ATOL, SMALL

L = 32
BLOCK = 8


def _factors(n: int, low: float, high: float, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(n, generator=gen) * (high - low) + low
    return sorted(round(float(v), 4) for v in values)


@pytest.fixture(scope="module", params=["phi3.5", "phi4-mini"])
def longrope(request, tmp_path_factory):
    """(model dir, HF model in float32). Phi-3.5-style: full rotation, untied
    head, the config in transformers 5's ``rope_parameters``. Phi-4-mini-style:
    ``partial_rotary_factor`` 0.75 (12 of 16 dimensions turned), tied head,
    the config rewritten as the released checkpoints ship it (4.x
    ``rope_scaling`` with ``"type": "longrope"``, top-level ``rope_theta``,
    ``partial_rotary_factor`` and ``original_max_position_embeddings``), read
    by both sides from the same file."""
    from transformers import Phi3Config, Phi3ForCausalLM

    partial = request.param == "phi4-mini"
    pairs = 6 if partial else 8
    rope = {"rope_type": "longrope", "rope_theta": 1000.0,
            "short_factor": _factors(pairs, 1.0, 1.5, 1),
            "long_factor": _factors(pairs, 1.0, 12.0, 2)}
    if partial:
        rope["partial_rotary_factor"] = 0.75
    torch.manual_seed(43)
    cfg = Phi3Config(**{**SMALL, "max_position_embeddings": 128},
                     original_max_position_embeddings=L, rope_parameters=rope,
                     tie_word_embeddings=partial, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2)
    path = tmp_path_factory.mktemp(request.param)
    Phi3ForCausalLM(cfg).float().save_pretrained(path)
    if partial:
        raw = json.loads((path / "config.json").read_text())
        params = raw.pop("rope_parameters")
        raw["rope_scaling"] = {"type": "longrope", "short_factor": params["short_factor"],
                               "long_factor": params["long_factor"]}
        raw.update(rope_theta=1000.0, partial_rotary_factor=0.75,
                   original_max_position_embeddings=L)
        (path / "config.json").write_text(json.dumps(raw))
    hf = Phi3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf.model.rotary_emb.attention_scaling > 1.0
    assert hf.model.rotary_emb.inv_freq.numel() == pairs
    return path, hf


def _runner(path, max_model_len=None, fused=True) -> ModelRunner:
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32",
                                     max_model_len=max_model_len),
                         CacheConfig(block_size=BLOCK, num_kv_blocks=128))
    runner.model.fused_steps = fused
    return runner


def _chunked(runner, seqs, decode=3) -> list[torch.Tensor]:
    """Each sequence (at least ``2 * decode + 1`` tokens) in steps: its first
    half, the rest but the last ``decode`` tokens, then ``decode`` one-token
    steps; float32 logits of every position, one tensor per sequence."""
    assert all(len(s) > 2 * decode for s in seqs)
    maker = BatchMaker(runner.num_kv_blocks, BLOCK, seed=5,
                       num_groups=runner.kv_layout.num_groups)
    out = [[] for _ in seqs]
    cuts = [(len(s) // 2, len(s) - decode) for s in seqs]
    steps = [[(0, a) for a, _ in cuts], [(a, b - a) for a, b in cuts]]
    steps += [[(b + i, 1) for _, b in cuts] for i in range(decode)]
    for step in steps:
        live = [(i, start, n) for i, (start, n) in enumerate(step) if n > 0]
        logits = runner.execute_model(maker.batch(
            [Chunk(str(i), seqs[i], start, n) for i, start, n in live]))
        row = 0
        for i, _, n in live:
            out[i].append(logits[row:row + n])
            row += n
    return [torch.cat(parts) for parts in out]


def _seqs(lengths, seed=7) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SMALL["vocab_size"], (n,), generator=gen).tolist()
            for n in lengths]


@pytest.mark.parametrize("fused", [True, False], ids=["decoder-stack", "python-layers"])
def test_long_factors_match_hf_past_original_length(longrope, fused):
    """max_model_len 128 > L: sequences longer than L, chunked so that their
    first chunk ends before L (HF rotates it with the long set too, in its
    forward over the whole sequence)."""
    path, hf = longrope
    runner = _runner(path, fused=fused)
    assert runner.max_model_len == 128
    seqs = _seqs((33, 40, 70, 101))
    for s, got in zip(seqs, _chunked(runner, seqs), strict=True):
        assert (got - hf_logits(hf, s)).abs().max().item() < ATOL


@pytest.mark.parametrize("fused", [True, False], ids=["decoder-stack", "python-layers"])
def test_short_factors_match_hf_when_max_model_len_is_original(longrope, fused):
    path, hf = longrope
    runner = _runner(path, max_model_len=L, fused=fused)
    seqs = _seqs((7, 17, 31, L), seed=8)
    for s, got in zip(seqs, _chunked(runner, seqs), strict=True):
        assert (got - hf_logits(hf, s)).abs().max().item() < ATOL


def test_request_crossing_original_length_mid_decode(longrope):
    """max_model_len 128: a 26-token prompt decoded greedily to 44 tokens,
    one token a step. Every step whose sequence is longer than L gives HF's
    logits for that sequence (as HF generate after it recomputes its cache
    at the crossing); the steps at lengths <= L give HF's logits with the
    long set forced and differ from HF's default (short) ones."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path, hf = longrope
    runner = _runner(path)
    maker = BatchMaker(runner.num_kv_blocks, BLOCK, seed=2)
    tokens = _seqs((26,), seed=9)[0]
    chunk = Chunk("a", tokens, 0, len(tokens))
    steps = []
    while len(tokens) < 44:
        last = runner.execute_model(maker.batch([chunk]))[-1]
        steps.append((list(tokens), last))
        tokens.append(int(last.argmax()))
        chunk = Chunk("a", tokens, len(tokens) - 1, 1)
    rotary = hf.model.rotary_emb
    short = rotary.original_inv_freq.clone()
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf.config, seq_len=L + 1)
    assert not torch.equal(short, long)
    within = [(seq, got) for seq, got in steps if len(seq) <= L]
    past = [(seq, got) for seq, got in steps if len(seq) > L]
    assert len(within) == 7 and len(past) == 11
    for seq, got in past:
        assert (got - hf_logits(hf, seq)[-1]).abs().max().item() < ATOL
    for seq, got in within:
        assert (got - hf_logits(hf, seq)[-1]).abs().max().item() > 10 * ATOL
    try:
        rotary.original_inv_freq.copy_(long)  # HF's long set below L too
        for seq, got in within:
            assert (got - hf_logits(hf, seq)[-1]).abs().max().item() < ATOL
    finally:
        rotary.original_inv_freq.copy_(short)


def test_greedy_ids_match_hf_generate(longrope, attn_ops):
    """A 36-token prompt (past L: HF's prefill and decode both take the long
    set, as we do) and 14 greedy tokens."""
    path, hf = longrope
    prompt = _seqs((36,), seed=10)[0]
    ours, ref = greedy_matches_hf_generate(path, hf, attn_ops, prompt, 14)
    assert ours == ref


def test_longrope_table_rejects_factors_that_do_not_fit():
    params = {"rope_type": "longrope", "rope_theta": 1000.0, "partial_rotary_factor": 0.75,
              "short_factor": [1.0] * 8, "long_factor": [2.0] * 6,
              "original_max_position_embeddings": L, "max_position_embeddings": 128}
    with pytest.raises(ValueError, match="short_factor must be a list of 6 numbers"):
        RotaryEmbedding(16, L, params, torch.float32)
    RotaryEmbedding(16, 64, params, torch.float32)  # the long set fits
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(16, 64, {**params, "partial_rotary_factor": 0.3125}, torch.float32)


def test_partial_rotation_is_refused_outside_phi3():
    """Only Phi-3 lays q/k out for a partial rotation; a Llama config with one
    is refused with the reason."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(**SMALL)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1000.0,
                           "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rope_parameters(cfg)
    assert rope_parameters(cfg, partial_rotation=True)["partial_rotary_factor"] == 0.5
