"""What the hybrid causal LMs share (Qwen3-Next / Qwen3.5, Nemotron-H,
Granite 4.0-H): their layers' token mixers take their KV cache group from
the layout (attention: a block-table group; recurrent: the state group), a
CPU step runs only the core's matmuls under the same conditions, and the
logits are the float32 LM head's."""

from __future__ import annotations

import torch
from torch import nn

from paternoster import kernels
from paternoster.model.kv_layout import KVCacheLayout
from paternoster.model.qwen3_next_weights import HybridWeights


class HybridCausalLM(HybridWeights, nn.Module):
    """The base of the hybrid models; expects ``layers``, ``lm_head``,
    ``batch_invariant`` (and HybridWeights' attributes)."""

    fused_steps = False

    def cached_mixer(self, layer: nn.Module) -> nn.Module | None:
        """The layer's module that reads a KV cache group (``kv_group``), or
        None for a layer without a cache; ``layer.mixer`` by default."""
        return layer.mixer

    def set_kv_cache_layout(self, layout: KVCacheLayout) -> None:
        """Give each layer with a cache its KV cache group.

        Raises:
            ValueError: a layout for another number of layers.
        """
        if len(layout.layer_groups) != len(self.layers):
            raise ValueError(f"KV cache layout for {len(layout.layer_groups)} layers, "
                             f"the model has {len(self.layers)}")
        for layer, group in zip(self.layers, layout.layer_groups, strict=True):
            mixer = self.cached_mixer(layer)
            if mixer is not None:
                mixer.kv_group = group
        self.kv_cache_layout = layout

    def core_only_step(self, num_tokens: int) -> bool:
        """Whether a CPU step of ``num_tokens`` tokens runs only the core's
        matmul kernels (for the runner's thread polling)."""
        return kernels.core_runs_matmuls(num_tokens) or self.batch_invariant

    def logits_divisor(self) -> float:
        """What the logits are divided by (Granite's ``logits_scaling``); 1."""
        return 1.0

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[N, H]`` -> float32 logits ``[N, V]`` (as the Llama
        model's), divided by :meth:`logits_divisor`."""
        logits = kernels.linear(hidden, self.lm_head, out_dtype=torch.float32,
                                invariant=self.batch_invariant)
        scale = self.logits_divisor()
        return logits if scale == 1.0 else logits / scale
