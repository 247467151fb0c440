"""OLMo 2, OLMo 3 and EXAONE 4 (post-norm blocks; OLMo's q/k norms over the
whole projection, EXAONE's per head; OLMo 3's and EXAONE 4's sliding layers,
EXAONE 4's full layers without RoPE) against HF transformers' own models on
tiny random-weight checkpoints: float32 logits over a chunked prefill and a
batched decode that reach past the window, and greedy ids through the engine
with 5-token prefill chunks, a prefix-cache hit and a preemption (each
asserted to happen) equal to HF ``generate``'s."""

from __future__ import annotations

import pytest
import torch

from .conftest import engine_greedy, hf_generate
from .test_engine_greedy import _engine, _prompts
from .test_tiny_models import SMALL, _compare

WINDOW = 12
LAYERS = 4
SLIDING_3_OF_4 = ["sliding_attention"] * 3 + ["full_attention"]
ARCHS = ["olmo2", "olmo3", "exaone4", "exaone4-no-window"]


def _build(arch: str):
    import transformers as tf

    base = {**SMALL, "num_hidden_layers": LAYERS, "pad_token_id": 0}
    if arch == "olmo2":
        return tf.Olmo2ForCausalLM(tf.Olmo2Config(**base, rope_theta=1000.0))
    if arch == "olmo3":
        rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 2.0,
                                   "original_max_position_embeddings": 128},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}
        return tf.Olmo3ForCausalLM(tf.Olmo3Config(**base, sliding_window=WINDOW,
                                                  rope_parameters=rope))
    if arch == "exaone4":
        return tf.Exaone4ForCausalLM(tf.Exaone4Config(**base, head_dim=16, sliding_window=WINDOW,
                                                      layer_types=SLIDING_3_OF_4))
    return tf.Exaone4ForCausalLM(tf.Exaone4Config(**base, head_dim=16, sliding_window=None,
                                                  layer_types=["full_attention"] * LAYERS))


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    torch.manual_seed(ARCHS.index(request.param) + 140)
    hf = _build(request.param).float()
    with torch.no_grad():  # sharper logits than the 0.02 init (fewer near-ties), and norm
        for name, param in hf.named_parameters():  # weights away from 1, so that they matter
            if param.dim() == 2:
                param.normal_(0.0, 0.08)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, path, hf.eval()


def test_logits_match_hf_forward_past_the_window(model, attn_ops):
    arch, path, hf = model
    runner = _compare(path, hf, attn_ops, lengths=(1, 37, 50, 9))
    attn = [layer.self_attn for layer in runner.model.layers]
    windowed = arch in ("olmo3", "exaone4")
    assert [a.sliding_window for a in attn] == ([WINDOW] * 3 + [0] if windowed else [0] * 4)
    # EXAONE 4's full layers skip RoPE when the model has a window.
    assert [a.use_rope for a in attn] == ([True] * 3 + [False] if arch == "exaone4"
                                          else [True] * 4)
    assert runner.model._decoder_stack(1, runner.kv_caches) is None  # post-norm: Python layers


def prefix_hit_gives_hf_generate_ids(path, hf) -> None:
    """5-token prefill chunks and a prefix-cache hit (asserted) through the
    engine give HF ``generate``'s greedy ids."""
    engine = _engine(path, blocks=64, budget=5, caching=True)
    shared = _prompts(1, (19,))[0]  # two full blocks of 8 shared
    prompts = [shared + [40, 41], shared + [50]]
    first = engine_greedy(engine, prompts[:1], 8)
    hits = engine.stats()["prefix_cache_hits"]
    second = engine_greedy(engine, prompts[1:], 8)
    assert engine.stats()["prefix_cache_hits"] > hits
    assert first + second == [hf_generate(hf, p, 8) for p in prompts]


def preemption_gives_hf_generate_ids(path, hf, blocks: int) -> None:
    """Four requests in ``blocks`` KV blocks: a preemption (asserted) and
    recomputation, HF ``generate``'s greedy ids."""
    engine = _engine(path, blocks=blocks, budget=64)
    prompts = _prompts(2, (16, 17, 18, 19))
    got = engine_greedy(engine, prompts, 10)
    assert engine.stats()["num_preemptions_total"] > 0
    assert got == [hf_generate(hf, p, 10) for p in prompts]


def test_chunked_prefill_and_prefix_cache_hit_give_hf_generate_ids(model):
    _, path, hf = model
    prefix_hit_gives_hf_generate_ids(path, hf)


def test_preemption_recomputes_hf_generate_ids(model):
    arch, path, hf = model
    # Windowed models hold blocks in two groups (full and sliding) per token.
    preemption_gives_hf_generate_ids(path, hf, 20 if arch in ("olmo3", "exaone4") else 12)


def test_olmo_norm_gives_hfs_bits_in_bfloat16():
    """HF's Olmo2RMSNorm applies the weight in float32 and casts once."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from paternoster.model.olmo2 import OlmoRMSNorm

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(7, 48, generator=gen).to(torch.bfloat16) * 3
    ref = Olmo2RMSNorm(48, eps=1e-6).to(torch.bfloat16)
    ours = OlmoRMSNorm(48, 1e-6, torch.bfloat16)
    with torch.no_grad():
        ref.weight.uniform_(-2, 2, generator=gen)
        ours.weight.copy_(ref.weight)
    assert torch.equal(ours(x), ref(x))
