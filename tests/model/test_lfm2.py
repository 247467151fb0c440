"""LFM2 and LFM2-MoE against HF transformers' own classes on tiny
random-weight checkpoints: gated short-conv layers and attention layers
with per-head q/k norms, LFM2's adjusted MLP size, LFM2-MoE's dense first
layer and sigmoid-routed experts with a selection bias. Float32 logits over
a chunked prefill (chunks of every length around the conv width) and a
batched decode step, built by the C++ KV cache manager's recurrent-state
group; greedy ids equal to HF ``generate`` through the engine (whole
prompts, 5-token chunks, preemption, each asserted)."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

from .conftest import engine_greedy, hf_generate
from .hybrid_checks import (
    file_logits_match_hf,
    hybrid_engine,
    logits_match_hf,
    random_prompts,
)

BLOCK_SIZE = 8
TYPES = ["conv", "conv", "full_attention", "conv", "full_attention"]
BASE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, layer_types=TYPES,
            pad_token_id=0, norm_eps=1e-5)
KINDS = ["lfm2", "lfm2_moe"]


def _build(kind: str):
    import transformers as tf

    if kind == "lfm2":  # 2/3 of 288 = 192, times 0.8 = 153, up to a multiple of 32 = 160
        return tf.Lfm2ForCausalLM(tf.Lfm2Config(**BASE, intermediate_size=288,
                                                block_ffn_dim_multiplier=0.8,
                                                block_multiple_of=32))
    return tf.Lfm2MoeForCausalLM(tf.Lfm2MoeConfig(
        **BASE, intermediate_size=96, moe_intermediate_size=32, num_experts=6,
        num_experts_per_tok=2, num_dense_layers=1, routed_scaling_factor=1.5))


@pytest.fixture(scope="module", params=KINDS)
def lfm2(request, tmp_path_factory):
    torch.manual_seed(KINDS.index(request.param) + 90)
    model = _build(request.param).float()
    with torch.no_grad():  # sharper logits than the 0.02 init, norms away from 1, and
        for name, param in model.named_parameters():  # a selection bias that matters
            if param.dim() >= 2:
                param.normal_(0.0, 0.08)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.uniform_(-0.3, 0.3)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model.eval()


def test_logits_match_hf_over_chunked_prefill_and_decode(lfm2):
    kind, path, hf = lfm2
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=96), max_num_seqs=4)
    assert runner.kv_layout.group_recurrent == (False, True)
    conv_state, = runner.kv_caches[0]
    assert conv_state.shape == (4, 64, 2)  # [slots, H, K - 1]
    # Step 1: one token, then two (shorter than the conv's reach); step 2:
    # the rest; step 3: one decode token each, batched.
    logits_match_hf(runner, hf, (1, 3, 40, 21), [0, 1, 2, 17])


@pytest.mark.parametrize(("scheduler", "budget", "blocks"),
                         [("fcfs", 256, 64), ("chunked_prefill", 5, 64), ("fcfs", 256, 12)],
                         ids=["whole-prefill", "chunked-5", "preempting"])
def test_engine_greedy_ids_equal_hf_generate(lfm2, scheduler, budget, blocks):
    kind, path, hf = lfm2
    engine = hybrid_engine(path, scheduler, budget, blocks)
    # 12 blocks of 8 hold three of these at once but not their growth: preemption.
    prompts = random_prompts((26, 27, 28, 29) if blocks == 12 else (1, 20, 13, 60))
    ours = engine_greedy(engine, prompts, 10)
    if blocks == 12:
        assert engine.stats()["num_preemptions_total"] > 0
    assert engine.kv_cache_manager.num_free_state_slots() == 4  # all returned
    assert ours == [hf_generate(hf, p, 10) for p in prompts]


def test_batch_invariant_mode_chunked_equals_whole(lfm2):
    """Logprobs bit-identical for a prompt whole and in 7-token chunks (the
    conv takes every token through the one-token form in this mode)."""
    kind, path, _ = lfm2
    if kind != "lfm2":
        pytest.skip("the dense model suffices")
    from .test_qwen3_next import _invariant_run

    gen = torch.Generator().manual_seed(21)
    target = torch.randint(3, 128, (45,), generator=gen).tolist()
    _, alone = _invariant_run(path, [target])
    _, chunked = _invariant_run(path, [target], scheduler="chunked_prefill",
                                max_num_batched_tokens=7)
    assert chunked[0] == alone[0]


def test_moe_routing_uses_the_bias_to_choose_and_the_scores_to_weigh(lfm2):
    """The block's experts and weights against HF's router on the same
    hidden states (the bias changes the choice on some tokens)."""
    kind, path, hf = lfm2
    if kind != "lfm2_moe":
        pytest.skip("LFM2-MoE only")
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=16), max_num_seqs=1)
    ours = runner.model.layers[1].mlp
    theirs = hf.model.layers[1].feed_forward
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    weights, experts = ours.route(x)
    with torch.no_grad():
        _, ref_w, ref_e = theirs.gate(x, theirs.expert_bias)
        unbiased = torch.topk(torch.sigmoid(x @ theirs.gate.weight.T), 2).indices
    assert torch.equal(experts, ref_e)
    torch.testing.assert_close(weights, ref_w, rtol=0, atol=1e-6)
    assert not torch.equal(experts.sort().values, unbiased.sort().values)
    # The whole block as one call into the core (its own sigmoid routing).
    few = x[:5]
    assert ours.core_experts(few.shape[0]) is not None
    with torch.no_grad():
        ref = theirs(few[None])[0]
    torch.testing.assert_close(ours(few), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_file_as_llama_cpp_writes_it_matches_hf(tmp_path, kind):
    """An LFM2 / LFM2-MoE GGUF file as llama.cpp's converter writes it
    (per-layer KV head counts marking the conv layers, the adjusted MLP
    size, stacked experts, ``exp_probs_b``; tests/model/gguf_writer_lfm2.py),
    matrices kept quantized where they lie: float32 logits over a chunked
    prefill and one-token decode steps match HF's model on the file's
    dequantized weights."""
    from paternoster.kernels import QuantizedWeight

    from .gguf_writer_lfm2 import write_lfm2_gguf
    from .test_gguf import _runner

    torch.manual_seed(KINDS.index(kind) + 95)
    hf = _build(kind).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
        for name, buf in hf.named_buffers():
            if name.endswith("expert_bias"):
                buf.uniform_(-0.3, 0.3)
    for layer in hf.model.layers:  # the converter writes no key for it (1 in LFM2-8B-A1B)
        if hasattr(layer.feed_forward, "gate"):
            layer.feed_forward.gate.routed_scaling_factor = 1.0
    path = tmp_path / f"tiny-{kind}.gguf"
    hf.load_state_dict(write_lfm2_gguf(hf, path))
    runner = _runner(path)
    assert type(runner.model).__name__ == type(hf).__name__
    assert runner.model.layer_types == TYPES
    assert isinstance(runner.model.layers[0].mixer.in_proj_weight, QuantizedWeight)
    assert runner.model._all_quantized()  # every matrix, the conv layers' too
    file_logits_match_hf(runner, hf)
