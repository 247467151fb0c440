"""KV cache groups: the layout of layers onto groups and shared cache slots,
the per-layer windows read from transformers configs, and the block bound the
runner sizes ``max_model_len`` with, checked against the C++ KVCacheManager
driven step by step."""

from __future__ import annotations

import random

import pytest
from transformers import Gemma3TextConfig, MistralConfig, Qwen2Config, Qwen3Config

from paternoster import _core
from paternoster.model.kv_layout import KVCacheLayout, layer_windows


def test_one_kind_of_layer_is_one_group_of_all_layers():
    layout = KVCacheLayout.from_windows([0] * 5)
    assert layout.group_windows == (0,)
    assert layout.layer_groups == (0,) * 5
    assert layout.layer_slots == (0, 1, 2, 3, 4)
    assert layout.num_slots == 5
    sliding = KVCacheLayout.from_windows([64] * 3)
    assert sliding.group_windows == (64,) and sliding.num_slots == 3


def test_gemma3_1b_pattern():
    # 26 layers, every sixth one global: 22 sliding in 6 groups of 4 (the
    # last one short), 4 global in one group; 4 shared slots.
    windows = [0 if i % 6 == 5 else 512 for i in range(26)]
    layout = KVCacheLayout.from_windows(windows)
    assert layout.num_slots == 4
    assert sorted(layout.group_windows) == [0] + [512] * 6
    for layer, w in enumerate(windows):
        assert layout.group_windows[layout.layer_groups[layer]] == w


@pytest.mark.parametrize("seed", range(20))
def test_no_two_layers_share_a_group_and_slot(seed):
    # Two layers may share a cache tensor only across groups (whose block ids
    # are disjoint); within a group every layer needs its own slot.
    rng = random.Random(seed)
    windows = [rng.choice([0, 0, 16, 128]) for _ in range(rng.randint(1, 40))]
    layout = KVCacheLayout.from_windows(windows)
    pairs = list(zip(layout.layer_groups, layout.layer_slots, strict=True))
    assert len(set(pairs)) == len(windows)
    assert all(0 <= s < layout.num_slots for s in layout.layer_slots)
    assert layout.num_slots == min(windows.count(w) for w in set(windows))


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="at least one layer"):
        KVCacheLayout.from_windows([])
    with pytest.raises(ValueError, match=">= 0"):
        KVCacheLayout.from_windows([0, -1])


def test_layer_windows_follow_transformers_configs():
    qwen2 = Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=2,
                        num_hidden_layers=4)
    assert layer_windows(qwen2) == [0, 0, 64, 64]
    assert layer_windows(Qwen2Config(num_hidden_layers=3)) == [0, 0, 0]
    assert layer_windows(Qwen3Config(num_hidden_layers=2)) == [0, 0]
    assert layer_windows(MistralConfig(sliding_window=64, num_hidden_layers=3)) == [64] * 3
    assert layer_windows(MistralConfig(sliding_window=None, num_hidden_layers=2)) == [0, 0]
    gemma = Gemma3TextConfig(num_hidden_layers=12, sliding_window=32)
    expect = [0 if t == "full_attention" else 32 for t in gemma.layer_types]
    assert layer_windows(gemma) == expect and 0 in expect and 32 in expect


def _peak_blocks(layout: KVCacheLayout, prompt: int, decode: int, block_size: int,
                 chunk: int) -> int:
    """Most blocks one request holds in the real KVCacheManager over a chunked
    prefill and ``decode`` single-token steps."""
    kv = _core.KVCacheManager(1 << 20, block_size, sliding_windows=list(layout.group_windows))
    computed, peak = 0, 0
    while computed < prompt + decode:
        step = min(chunk, prompt - computed) if computed < prompt else 1
        assert kv.allocate_slots(0, computed + step, computed)
        computed += step
        peak = max(peak, kv.num_request_blocks(0))
    return peak


@pytest.mark.parametrize("seed", range(12))
def test_block_bound_holds_for_the_real_manager(seed):
    rng = random.Random(seed)
    windows = [rng.choice([0, 5, 16, 33]) for _ in range(rng.randint(1, 6))]
    layout = KVCacheLayout.from_windows(windows)
    bs, chunk = rng.choice([1, 4, 16]), rng.choice([1, 7, 64])
    prompt, decode = rng.randint(1, 300), rng.choice([0, rng.randint(0, 40)])
    if seed % 3 == 0:  # whole chunks past every window: the tightness check below
        prompt, decode = chunk * (3 + -(-33 // chunk) + rng.randint(0, 3)), 0
    peak = _peak_blocks(layout, prompt, decode, bs, chunk)
    bound = layout.blocks_for(prompt + decode, bs, chunk)
    assert peak <= bound
    # Tight up to block alignment (both ends of a step's reach) in each
    # sliding group when the request ends on a whole chunk past the window
    # (the bound assumes a full chunk at the end: single-token decode steps
    # after the prompt hold fewer).
    if seed % 3 == 0:
        sliding = sum(1 for w in layout.group_windows if w)
        assert bound - peak <= 2 * sliding


def test_max_tokens_is_the_longest_context_that_fits():
    layout = KVCacheLayout.from_windows([0, 8, 8, 0])  # one full, one sliding group
    for num_blocks in (2, 10, 100):
        n = layout.max_tokens(num_blocks, 4, 16, cap=10_000)
        assert layout.blocks_for(n, 4, 16) <= num_blocks
        assert n == 10_000 or layout.blocks_for(n + 1, 4, 16) > num_blocks
    full = KVCacheLayout.from_windows([0, 0])
    assert full.max_tokens(10, 4, 16, cap=10_000) == 40  # every block, one group
    assert layout.max_tokens(10, 4, 16, cap=12) == 12
