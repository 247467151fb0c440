"""SmolLM3 (Hugging Face 2025, "SmolLM3: smol, multilingual, long-context
reasoner"): the Llama block with RoPE left out of every fourth layer ("NoPE"
layers, chosen by the config's ``no_rope_layers``: 1 = rotate, 0 = not), as
in Yang et al. 2025 ("Rope to Nope and back again"); the other layers rotate
as Llama does.

Matches HF transformers' ``SmolLM3ForCausalLM`` (tests/model/test_smollm3.py;
its optional sliding window, ``use_sliding_window``, off in the released
checkpoints: tests/model/test_sliding_window.py).
"""

from __future__ import annotations

import torch

from paternoster.model.attention import AttentionOps
from paternoster.model.llama import LlamaForCausalLM


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3-3B and its config family.

    Raises:
        ValueError: ``no_rope_layers`` not one 0/1 flag per layer, or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        flags = list(getattr(config, "no_rope_layers", None) or [])
        if len(flags) != config.num_hidden_layers or any(f not in (0, 1) for f in flags):
            raise ValueError(f"no_rope_layers must hold one 0/1 flag per layer "
                             f"({config.num_hidden_layers}), got {flags}")
        super().__init__(config, dtype, ops, max_positions, batch_invariant)
        for layer, rotate in zip(self.layers, flags, strict=True):
            layer.self_attn.use_rope = bool(rotate)
