"""Qwen3-Next and Qwen3.5 (dense, MoE, and the vision-language checkpoint's
text tower) against HF transformers' own classes on tiny random-weight
checkpoints: three Gated DeltaNet layers and one gated full-attention layer,
partial RoPE, routed + shared experts. Float32 logits over a chunked prefill
(chunks crossing the delta rule's 64-token chunk) and a batched decode step,
built by the C++ KV cache manager's recurrent-state group; greedy ids equal
to HF ``generate`` through the engine (whole prompts, 5-token chunks,
preemption)."""

from __future__ import annotations

import logging

import pytest
import torch

from paternoster import _core
from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.model.kv_layout import KVCacheLayout, kv_cache_layout
from paternoster.model.runner import ModelRunner

from .conftest import engine_greedy, hf_generate
from .hybrid_checks import hybrid_engine, logits_match_hf, random_prompts

BLOCK_SIZE = 8
TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=256,
            layer_types=TYPES, pad_token_id=0)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=48)


def _randomize_norms(model) -> None:
    """Norm weights away from their init (0 for the ``1 + w`` norms, 1 for the
    gated one), so a wrong form shows in the logits."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5) if "linear_attn" in name else param.uniform_(-0.5, 0.5)


def _build(kind: str):
    import transformers as tf

    if kind == "qwen3_next":  # dense and MoE layers mixed
        return tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**TEXT, **MOE, decoder_sparse_step=2))
    if kind == "qwen3_5":
        return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**TEXT))
    if kind == "qwen3_5_moe":
        return tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**TEXT, **MOE))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                  out_hidden_size=64, patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
    return tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=TEXT,
                                                               vision_config=vision))


KINDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_vl"]


@pytest.fixture(scope="module", params=KINDS)
def hybrid(request, tmp_path_factory):
    torch.manual_seed(KINDS.index(request.param) + 60)
    model = _build(request.param).float()
    _randomize_norms(model)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path, model.eval()


def test_logits_match_hf_over_chunked_prefill_and_decode(hybrid):
    kind, path, hf = hybrid
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32"),
                         CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=96), max_num_seqs=4)
    assert runner.num_state_slots == 4
    assert runner.kv_layout.group_recurrent == (False, True)
    # Step 1: first halves; step 2: the rest (a 1-token prompt, chunks that
    # cross the 64-token chunk); step 3: one decode token each, batched.
    lengths = (1, 37, 150, 91)
    logits_match_hf(runner, hf, lengths, [n // 2 for n in lengths])


@pytest.mark.parametrize(("scheduler", "budget", "blocks"),
                         [("fcfs", 256, 64), ("chunked_prefill", 5, 64), ("fcfs", 256, 16)],
                         ids=["whole-prefill", "chunked-5", "preempting"])
def test_engine_greedy_ids_equal_hf_generate(hybrid, scheduler, budget, blocks):
    kind, path, hf = hybrid
    if kind == "qwen3_5_vl" and scheduler != "chunked_prefill":
        pytest.skip("the text tower is the Qwen3.5 model; one engine case checks its loading")
    engine = hybrid_engine(path, scheduler, budget, blocks)
    # 16 blocks of 8 hold three of these at once but not their growth: preemption.
    prompts = random_prompts((36, 37, 38, 39) if blocks == 16 else (1, 20, 13, 90))
    ours = engine_greedy(engine, prompts, 10)
    if blocks == 16:
        assert engine.stats()["num_preemptions_total"] > 0
    assert engine.kv_cache_manager.num_free_state_slots() == 4  # all returned
    stats = engine.stats()
    assert stats["num_free_state_slots"] == 4 and stats["state_slot_usage"] == 0.0
    assert ours == [hf_generate(hf, p, 10) for p in prompts]


def test_prefix_caching_is_turned_off_with_a_log_line(hybrid, caplog):
    kind, path, _ = hybrid
    if kind != "qwen3_5":
        pytest.skip("one architecture suffices")
    with caplog.at_level(logging.INFO):
        engine = EngineCore(EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32"),
            cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=32,
                              enable_prefix_caching=True)))
    assert not engine.kv_cache_manager.enable_caching()
    assert "prefix caching off" in caplog.text
    with pytest.raises(ValueError, match="prefix caching"):
        _core.KVCacheManager(8, 4, enable_caching=True, sliding_windows=[0, 0],
                             recurrent=[False, True], num_state_slots=2)


def test_states_come_out_of_the_kv_cache_budget(hybrid):
    kind, path, _ = hybrid
    if kind != "qwen3_5":
        pytest.skip("one architecture suffices")
    config = ModelConfig(model=str(path), dtype="float32")
    budget = 4 << 20
    runner = ModelRunner(config, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory=budget),
                         max_num_seqs=8)
    # Per slot and linear layer: conv [2*2*16 + 4*16, 3] float32 + ssm [4, 16, 16] float32.
    per_slot = (128 * 3 + 4 * 16 * 16) * 4
    assert runner.state_bytes() == per_slot * 8 * 3
    assert runner.num_kv_blocks == (budget - runner.state_bytes()) // runner.bytes_per_block()
    conv, ssm = runner.kv_caches[0]
    assert conv.shape == (8, 128, 3) and ssm.shape == (8, 4, 16, 16)
    assert ssm.dtype == torch.float32
    with pytest.raises(ValueError, match="recurrent state"):
        ModelRunner(config, CacheConfig(block_size=BLOCK_SIZE, kv_cache_memory=60_000),
                    max_num_seqs=8)


def test_linear_layers_form_one_recurrent_group_after_the_attention_groups():
    layout = KVCacheLayout.from_windows([0, 0, 0, 0, 512, 0],
                                        [True, True, False, True, False, False])
    # Attention layers 2, 5 (full) and 4 (window): groups of one layer each.
    assert layout.group_windows == (0, 0, 512, 0)
    assert layout.group_recurrent == (False, False, False, True)
    assert layout.recurrent_group == 3 and layout.num_recurrent_layers == 3
    assert layout.layer_groups == (3, 3, 0, 3, 2, 1)
    assert layout.layer_slots == (0, 1, 0, 2, 0, 0)
    # The recurrent group holds no blocks: only the three attention groups count.
    assert layout.blocks_for(40, 8, 40) == 5 * 3
    with pytest.raises(ValueError, match="attention layer"):
        KVCacheLayout.from_windows([0, 0], [True, True])

    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(num_hidden_layers=8)  # every fourth layer full attention
    layout = kv_cache_layout(cfg)
    assert layout.group_recurrent == (False, True)
    assert [layout.layer_groups[i] for i in range(8)] == [1, 1, 1, 0, 1, 1, 1, 0]


def _invariant_run(path, prompts: list[list[int]], **sched) -> tuple[EngineCore, list]:
    """Greedy 12 tokens with logprobs for each prompt in batch-invariant mode:
    (the engine, per prompt its token ids and repr of its logprobs)."""
    from .conftest import make_request_logprobs

    blocks = sched.pop("blocks", 96)
    engine = EngineCore(EngineConfig(
        model=ModelConfig(model=str(path), dtype="float32", batch_invariant=True),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_kv_blocks=blocks),
        scheduler=SchedulerConfig(max_num_seqs=4, **sched)))
    return engine, make_request_logprobs(engine, prompts, 12)


def test_batch_invariant_mode_alone_batched_chunked_preempted(hybrid):
    """Logprobs bit-identical for a request alone, among others, with its
    prompt in 7-token chunks and after a preemption (the linear layers take
    every token through the one-token forms in this mode)."""
    kind, path, _ = hybrid
    if kind not in ("qwen3_5", "qwen3_next"):
        pytest.skip("the dense and the MoE hybrid suffice")
    gen = torch.Generator().manual_seed(21)
    target = torch.randint(3, 128, (45,), generator=gen).tolist()
    others = [torch.randint(3, 128, (n,), generator=gen).tolist() for n in (36, 37, 38)]
    _, alone = _invariant_run(path, [target])
    _, batched = _invariant_run(path, others[:1] + [target] + others[1:])
    _, chunked = _invariant_run(path, [target], scheduler="chunked_prefill",
                                max_num_batched_tokens=7)
    engine, preempted = _invariant_run(path, [target] + others, blocks=18,
                                       scheduler="chunked_prefill", max_num_batched_tokens=64)
    assert engine.stats()["num_preemptions_total"] > 0
    assert [batched[1] == alone[0], chunked[0] == alone[0], preempted[0] == alone[0]] == [True] * 3
