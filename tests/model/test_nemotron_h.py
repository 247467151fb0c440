"""Nemotron-H and Nemotron 3 against HF transformers' own class on tiny
random-weight checkpoints: Mamba2 layers (grouped B/C, a state carried
across the scan's chunks), attention without RoPE, relu² MLP-only blocks
with no cache, and MoE blocks (sigmoid routing limited to the best expert
group, a correction bias, a shared expert; with and without the latent
projection). Float32 logits over a chunked prefill and a batched decode
step; greedy ids equal to HF ``generate`` through the engine (whole
prompts, 5-token chunks, preemption, each asserted)."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner

from .conftest import engine_greedy, hf_generate
from .hybrid_checks import hybrid_engine, logits_match_hf, random_prompts
from .test_qwen3_next import _invariant_run

BLOCK_SIZE = 8
KINDS = ["nemotron_h", "nemotron_3", "nemotron_3_latent"]


def _build(kind: str):
    import transformers as tf

    base = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, intermediate_size=96, ssm_state_size=16, mamba_num_heads=8,
                mamba_head_dim=8, n_groups=2, conv_kernel=4, chunk_size=16,
                max_position_embeddings=256, pad_token_id=0, tie_word_embeddings=False)
    if kind == "nemotron_h":  # Nemotron-H: "M-M*-M-"
        types = ["linear_attention", "mlp", "linear_attention", "full_attention", "mlp",
                 "linear_attention", "mlp"]
        return tf.NemotronHForCausalLM(tf.NemotronHConfig(**base, layers_block_type=types))
    types = ["linear_attention", "moe", "linear_attention", "full_attention", "moe"]
    moe = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
               moe_shared_expert_intermediate_size=48, n_group=4, topk_group=2,
               routed_scaling_factor=2.5, norm_topk_prob=True)
    if kind == "nemotron_3_latent":  # with biases on the shared expert and the projections
        moe.update(moe_latent_size=32, mlp_bias=True)
    return tf.NemotronHForCausalLM(tf.NemotronHConfig(**base, **moe, layers_block_type=types))


@pytest.fixture(scope="module", params=KINDS)
def nemotron(request, tmp_path_factory):
    torch.manual_seed(KINDS.index(request.param) + 110)
    model = _build(request.param).float()
    with torch.no_grad():  # sharper logits than the init, norms away from 1, a bias that counts
        for name, param in model.named_parameters():
            if param.dim() >= 2 and "conv1d" not in name:
                param.normal_(0.0, 0.08)
            elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(("dt_bias", ".D")):
                param.uniform_(-0.5, 1.0)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.uniform_(-0.2, 0.2)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model.eval()


def test_logits_match_hf_over_chunked_prefill_and_decode(nemotron):
    kind, path, hf = nemotron
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=96), max_num_seqs=4)
    assert runner.kv_layout.group_recurrent == (False, True)
    assert runner._rope_len() >= runner.max_model_len  # no RoPE: no table to bound it
    assert [c is None for c in runner.kv_caches] == [t in ("mlp", "moe")
                                                    for t in hf.config.layers_block_type]
    # Step 1: 0, 2, 25 and 17 tokens; step 2: the rest (chunks of the scan's
    # 16 crossed, from a carried state); step 3: one decode token each.
    logits_match_hf(runner, hf, (1, 5, 60, 37), [0, 2, 25, 17])


@pytest.mark.parametrize(("scheduler", "budget", "blocks"),
                         [("fcfs", 256, 64), ("chunked_prefill", 5, 64), ("fcfs", 256, 12)],
                         ids=["whole-prefill", "chunked-5", "preempting"])
def test_engine_greedy_ids_equal_hf_generate(nemotron, scheduler, budget, blocks):
    kind, path, hf = nemotron
    if kind == "nemotron_3_latent" and scheduler != "chunked_prefill":
        pytest.skip("the latent projection's engine case: chunked prefill suffices")
    engine = hybrid_engine(path, scheduler, budget, blocks)
    # 12 blocks of 8 hold three of these at once but not their growth: preemption.
    prompts = random_prompts((26, 27, 28, 29) if blocks == 12 else (1, 20, 13, 60))
    ours = engine_greedy(engine, prompts, 10)
    if blocks == 12:
        assert engine.stats()["num_preemptions_total"] > 0
    assert engine.kv_cache_manager.num_free_state_slots() == 4
    assert ours == [hf_generate(hf, p, 10) for p in prompts]


def test_batch_invariant_mode_chunked_equals_whole(nemotron):
    """Logprobs bit-identical for a prompt whole and in 7-token chunks (the
    Mamba layers take every token through the one-token forms)."""
    kind, path, _ = nemotron
    if kind != "nemotron_3":
        pytest.skip("one architecture suffices")
    gen = torch.Generator().manual_seed(21)
    target = torch.randint(3, 128, (45,), generator=gen).tolist()
    _, alone = _invariant_run(path, [target])
    _, chunked = _invariant_run(path, [target], scheduler="chunked_prefill",
                                max_num_batched_tokens=7)
    assert chunked[0] == alone[0]


def test_group_limited_routing_matches_hf_router(nemotron):
    """The experts and weights against HF's router on the same hidden
    states; the group limit changes the choice on some tokens."""
    kind, path, hf = nemotron
    if kind != "nemotron_3":
        pytest.skip("the MoE model")
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=16), max_num_seqs=1)
    ours = runner.model.layers[1].mixer.experts
    gate = hf.model.layers[1].mixer.gate
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    weights, experts = ours.route(x)
    with torch.no_grad():
        _, ref_w, ref_e = gate(x)
        scores = torch.sigmoid(x @ gate.weight.T) + gate.e_score_correction_bias
        unlimited = torch.topk(scores, 2).indices
    order, ref_order = experts.argsort(dim=-1), ref_e.argsort(dim=-1)
    assert torch.equal(experts.gather(1, order), ref_e.gather(1, ref_order))
    torch.testing.assert_close(weights.gather(1, order), ref_w.gather(1, ref_order),
                               rtol=0, atol=1e-6)
    assert not torch.equal(experts.sort().values, unlimited.sort().values)


def test_routed_relu2_experts_in_one_core_call_match_hf(nemotron):
    """The routed experts as one call into the core (sigmoid routing with
    the group limit and the correction bias, non-gated relu² experts)
    against HF's router and experts on the same hidden states."""
    kind, path, hf = nemotron
    if kind != "nemotron_3":
        pytest.skip("the MoE model")
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=16), max_num_seqs=1)
    ours = runner.model.layers[1].mixer.experts
    theirs = hf.model.layers[1].mixer
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(4))
    assert ours.core_experts(x.shape[0]) is not None
    with torch.no_grad():
        _, w, ids = theirs.gate(x)
        ref = theirs.experts(x, ids, w)
    torch.testing.assert_close(ours(x), ref, rtol=0, atol=1e-5)


def test_an_untied_head_is_made_on_the_models_device(nemotron):
    """load_model builds the model on its device: the untied LM head, made
    while loading, too (the meta device stands in for CUDA here)."""
    from paternoster import kernels
    from paternoster.model.loader import load_hf_config, load_model

    kind, path, _ = nemotron
    if kind != "nemotron_h":
        pytest.skip("one model suffices")
    model = load_model(path, load_hf_config(path), torch.float32, kernels,
                       device=torch.device("meta"))
    assert model.embed_tokens.device.type == model.lm_head.device.type == "meta"
    assert model.lm_head is not model.embed_tokens
