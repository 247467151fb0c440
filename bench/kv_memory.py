"""KV cache bytes one request holds at a long context: KV cache groups
(sliding-window layers release what falls out of their window;
recurrent layers hold one fixed-size state) against a
full-attention allocation of every token-mixing layer, for real model shapes.

For each shape the per-layer windows come from the transformers config class
(``layer_types`` / ``sliding_window``), the layout from
:class:`paternoster.model.kv_layout.KVCacheLayout`, and the blocks from the
C++ ``KVCacheManager`` itself: one request prefilled in chunks of
``--chunk`` tokens up to ``--context`` tokens, then ``--decode`` single-token
steps; the most blocks it held at once, times the bytes of one block id
(K and V in every shared cache slot), plus, for linear-attention layers, one
state slot (a bfloat16 convolution window and a float32 delta-rule state per
layer). Usage::

    .venv/bin/python bench/kv_memory.py [--context 32768] [--chunk 2048] [--decode 64]
"""

from __future__ import annotations

import argparse

import torch

from paternoster import _core
from paternoster.model import recurrent_state
from paternoster.model.kv_layout import KVCacheLayout, kv_cache_layout, layer_windows


def shapes() -> dict[str, object]:
    """transformers configs shaped as released checkpoints (layers, KV heads,
    head size, windows; the other fields do not touch the KV cache)."""
    from transformers import (
        Exaone4Config,
        Gemma3TextConfig,
        Lfm2Config,
        Ministral3Config,
        MistralConfig,
        Olmo3Config,
        Qwen2Config,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
        Qwen3NextConfig,
    )

    return {
        # google/gemma-3-4b-it's text model: 34 layers, 5 local (1024) per global.
        "Gemma 3 4B": Gemma3TextConfig(num_hidden_layers=34, num_key_value_heads=4,
                                       head_dim=256, sliding_window=1024),
        # google/gemma-3-27b-it: 62 layers, 16 KV heads of 128.
        "Gemma 3 27B": Gemma3TextConfig(num_hidden_layers=62, num_key_value_heads=16,
                                        head_dim=128, sliding_window=1024),
        # mistralai/Mistral-7B-v0.1: every layer a 4096 window.
        "Mistral 7B v0.1": MistralConfig(num_hidden_layers=32, num_key_value_heads=8,
                                         head_dim=128, sliding_window=4096),
        # A Qwen2 with max_window_layers (use_sliding_window on): 28 layers, last 4 windowed.
        "Qwen2 7B, window on": Qwen2Config(num_hidden_layers=28, num_key_value_heads=4,
                                           hidden_size=3584, num_attention_heads=28,
                                           use_sliding_window=True, sliding_window=4096,
                                           max_window_layers=24),
        # transformers' defaults (Qwen3-Next-80B-A3B's shape): 48 layers, one
        # in four full attention (2 KV heads of 256), the rest Gated DeltaNet.
        "Qwen3-Next 80B-A3B": Qwen3NextConfig(),
        # Qwen3_5TextConfig / Qwen3_5MoeTextConfig defaults: 32 and 40 layers.
        "Qwen3.5 (32 layers, 4 KV heads)": Qwen3_5TextConfig(),
        "Qwen3.5-MoE (40 layers, 2 KV heads)": Qwen3_5MoeTextConfig(),
        # allenai/Olmo-3-7B: 32 layers of 32 KV heads of 128, three in four a 4096 window.
        "OLMo 3 7B": Olmo3Config(num_hidden_layers=32, num_key_value_heads=32,
                                 num_attention_heads=32, hidden_size=4096,
                                 sliding_window=4096),
        # LGAI-EXAONE/EXAONE-4.0-32B: 64 layers, 8 KV heads of 128, "LLLG" with 4096.
        "EXAONE 4.0 32B": Exaone4Config(num_hidden_layers=64, num_key_value_heads=8,
                                        num_attention_heads=40, hidden_size=5120, head_dim=128,
                                        sliding_window=4096, sliding_window_pattern=4),
        # mistralai/Ministral-3-8B: 34 layers, 8 KV heads of 128, no window.
        "Ministral 3 8B": Ministral3Config(num_hidden_layers=34, num_key_value_heads=8,
                                           head_dim=128),
        # LiquidAI/LFM2-1.2B: 16 layers, 6 attention (8 KV heads of 64), 10 short-conv.
        "LFM2 1.2B": Lfm2Config(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                num_key_value_heads=8, full_attn_idxs=[2, 5, 8, 10, 12, 14]),
        # bench/shapes.py's 4B Nemotron-H (26 Mamba2, 22 MLP, 4 attention
        # layers of 8 KV heads of 128) and 1.5B Granite 4.0-H (36 Mamba2, 4
        # attention of 4 KV heads of 128).
        "Nemotron-H 4B shape": _shape("nemotron-h-4b"),
        "Granite 4.0-H 1B shape": _shape("granite-4.0-h-1b"),
    }


def _shape(name: str):
    """The config of a bench/shapes.py shape."""
    import transformers

    from paternoster.bench.shapes import SHAPES

    cls_name, kwargs = SHAPES[name]
    return getattr(transformers, cls_name)(**kwargs)


def request_bytes(cfg, context: int, chunk: int, decode: int, block_size: int,
                  elem: int = 2) -> tuple[int, int, KVCacheLayout]:
    """(bytes with KV cache groups, bytes with every token-mixing layer full
    attention, layout) for one request of ``context`` prompt tokens and
    ``decode`` generated ones (Nemotron-H's MLP-only blocks hold no cache in
    either)."""
    layout = kv_cache_layout(cfg)
    hkv = cfg.num_key_value_heads
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_layer_block = 2 * block_size * hkv * head * elem
    recurrent = list(layout.group_recurrent) or None
    kv = _core.KVCacheManager(1 << 24, block_size, sliding_windows=list(layout.group_windows),
                              recurrent=recurrent, num_state_slots=1 if recurrent else 0)
    computed, peak = 0, 0
    while computed < context + decode:
        step = min(chunk, context - computed) if computed < context else 1
        assert kv.allocate_slots(0, computed + step, computed)
        computed += step
        peak = max(peak, kv.num_request_blocks(0))
    grouped = peak * layout.num_slots * per_layer_block
    if layout.num_recurrent_layers:
        grouped += layout.num_recurrent_layers * recurrent_state.slot_bytes(
            cfg, torch.bfloat16 if elem == 2 else torch.float32)
    mixers = sum(1 for g in layout.layer_groups if g >= 0)  # MLP-only blocks hold nothing
    full = mixers * -(-(context + decode) // block_size) * per_layer_block
    return grouped, full, layout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=2048, help="prefill tokens per step")
    p.add_argument("--decode", type=int, default=64, help="decode steps after the prompt")
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args()
    print(f"one request: {args.context}-token prompt in {args.chunk}-token chunks, "
          f"{args.decode} decode steps, blocks of {args.block_size}, bfloat16 KV\n")
    print("| model shape | token-mixing layers (windowed or recurrent) | groups x slots | "
          "KV cache groups MiB | all layers full MiB | saving |")
    print("|---|---|---|---:|---:|---:|")
    for name, cfg in shapes().items():
        grouped, full, layout = request_bytes(cfg, args.context, args.chunk, args.decode,
                                              args.block_size)
        windowed = sum(1 for w in layer_windows(cfg) if w) + layout.num_recurrent_layers
        mixers = sum(1 for g in layout.layer_groups if g >= 0)
        print(f"| {name} | {mixers} ({windowed}) | "
              f"{layout.num_groups} x {layout.num_slots} | {grouped / 2**20:.0f} | "
              f"{full / 2**20:.0f} | {full / grouped:.2f}x |")


if __name__ == "__main__":
    main()
