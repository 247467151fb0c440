"""Phi-3 (Abdin et al. 2024, "Phi-3 Technical Report"): the Llama block with
the q/k/v and gate/up projections stored fused in the checkpoint
(``qkv_proj``, ``gate_up_proj``: the layout our layers use anyway, loaded
whole by :class:`~paternoster.model.llama_weights.LlamaWeights`) and an
untied LM head (tied in Phi-4-mini).

Matches HF transformers' ``Phi3ForCausalLM`` (tests/model/test_phi3.py,
tests/model/test_phi3_longrope.py) for:

- Phi-3-mini-4k, Phi-3-medium-4k: full-dimension RoPE without scaling;
  mini-4k's sliding window (2047) runs through the KV cache groups as
  Mistral's (:mod:`paternoster.model.kv_layout`);
- Phi-3-mini/medium-128k, Phi-3.5-mini: LongRoPE
  (:mod:`paternoster.model.longrope`, which says when the short and when the
  long factors apply: one set per engine, long when ``max_model_len``
  exceeds ``original_max_position_embeddings``);
- Phi-4-mini: LongRoPE over the first ``partial_rotary_factor`` (0.75) of
  each head. :meth:`Phi3ForCausalLM.load_weights` reorders the q and k rows
  of ``qkv_proj`` per head by
  :func:`~paternoster.model.rope.partial_rotation_order`, so the rotated
  pairs sit where the D-column RoPE table and kernels turn them (see
  :mod:`paternoster.model.rope`); the KV cache holds keys in that order.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from paternoster.kernels import QuantizedWeight, WeightParts
from paternoster.model.llama import LlamaForCausalLM
from paternoster.model.llama_weights import Weight
from paternoster.model.rope import partial_rotation_order


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 / Phi-3.5 / Phi-4-mini (see the module docstring).

    Raises:
        ValueError: an unsupported rope type, LongRoPE factors that do not
            fit the rotated dimensions, a partial rotation that leaves an odd
            number of them, or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """

    partial_rotation = True

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> list[str]:
        """:meth:`LlamaWeights.load_weights
        <paternoster.model.llama_weights.LlamaWeights.load_weights>`, then,
        under a partial rotation, each layer's q and k rows of ``qkv_weight``
        (and ``qkv_bias``) reordered per head by
        :func:`~paternoster.model.rope.partial_rotation_order`.

        Raises:
            ValueError: what ``LlamaWeights.load_weights`` raises, or
                quantized q/k weights under a partial rotation (no Phi-3
                checkpoint format here has them).
        """
        unused = super().load_weights(weights)
        if self.rotary.rotary_dim < self.rotary.head_dim:
            for layer in self.layers:
                _reorder_qk_rows(layer.self_attn, self.rotary.rotary_dim)
        return unused


def _reorder_qk_rows(attn, rot: int) -> None:
    """``qkv_weight`` [(Hq + 2 Hkv) * D, H] and ``qkv_bias``: q's and k's
    head rows put in :func:`partial_rotation_order`, v's left as they are."""
    d = attn.head_dim
    heads = (attn.q_size + attn.kv_size) // d  # q's then k's, D rows each
    rows = (torch.arange(heads)[:, None] * d + partial_rotation_order(d, rot)).reshape(-1)
    for name in ("qkv_weight", "qkv_bias"):
        param = getattr(attn, name)
        if param is None:
            continue
        if isinstance(param, QuantizedWeight | WeightParts):
            raise ValueError("partial rotation needs dense q/k weights, got quantized ones")
        param.data[: rows.numel()] = param.data[rows.to(param.device)]
