"""LFM2 and LFM2-MoE (Liquid AI 2025; HF ``Lfm2ForCausalLM``,
``Lfm2MoeForCausalLM``): hybrids built for CPUs and phones whose layers
(``layer_types``) are gated short convolutions (``"conv"``,
:class:`~paternoster.model.short_conv.ShortConv`) or grouped-query
attention with per-head q/k RMSNorms (``"full_attention"``, Qwen3's
block), each followed by a SwiGLU MLP (LFM2) or, past the first
``num_dense_layers``, routed experts with sigmoid scores and a selection
bias (LFM2-MoE). Pre-norm blocks with plain RMSNorms; the final norm is
the checkpoint's ``embedding_norm``.

KV memory: the attention layers form the paged KV cache group, the conv
layers the recurrent-state group (one ``[H, K - 1]`` conv state per
request). Prefix caching is off for these models, as for every model with
recurrent state (states are not saved at block boundaries). CPU steps run
the Python layers (the core's decoder stack is Llama-shaped). Matches HF
transformers' classes (tests/model/test_lfm2.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, RMSNorm, Rope
from paternoster.model.llama_weights import Weight
from paternoster.model.moe import Routing, SparseMoeBlock
from paternoster.model.qwen3 import Qwen3Attention
from paternoster.model.short_conv import ShortConv

CONV = "conv"

#: LFM2 checkpoint names (under a layer, or the model) -> the Llama vocabulary.
_RENAMES = {
    "operator_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "self_attn.out_proj.weight": "self_attn.o_proj.weight",
    "self_attn.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attn.k_layernorm.weight": "self_attn.k_norm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}

#: The GGUF loader's per-expert names -> LFM2's.
_EXPERT_PROJS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def ffn_size(config) -> int:
    """The dense MLP's intermediate size: LFM2 shrinks ``intermediate_size``
    to 2/3 with ``block_auto_adjust_ff_dim``, then scales it by
    ``block_ffn_dim_multiplier`` rounded up to ``block_multiple_of`` (HF
    ``Lfm2MLP``)."""
    size = int(config.intermediate_size)
    if getattr(config, "block_auto_adjust_ff_dim", False):
        size = int(2 * size / 3)
        mult = getattr(config, "block_ffn_dim_multiplier", None)
        if mult is not None:
            size = int(mult * size)
            step = int(config.block_multiple_of)
            size = step * ((size + step - 1) // step)
    return size


class _Lfm2Config:
    """An LFM2 config read with the Llama names the shared blocks use
    (``rms_norm_eps``, the MLP's adjusted ``intermediate_size``)."""

    def __init__(self, base, adjust_ffn: bool) -> None:
        self._base = base
        self.rms_norm_eps = base.norm_eps
        self.intermediate_size = ffn_size(base) if adjust_ffn else int(base.intermediate_size)
        self.hidden_act = "silu"

    def __getattr__(self, name: str):
        return getattr(self._base, name)


class ShortConvDecoderLayer(LlamaDecoderLayer):
    """The pre-norm block with LFM2's gated short convolution as its token
    mixer (``mixer``; checkpoint ``conv.*``) and the given feed-forward block."""

    def __init__(self, config, dtype: torch.dtype, mlp: nn.Module, invariant: bool) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mixer = ShortConv(config, dtype, invariant)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = mlp

    def mix(self, rope: Rope, h: torch.Tensor, cache, attn: AttentionMetadata) -> torch.Tensor:
        """The short convolution on ``h`` ``[T, H]``; ``cache`` is the
        layer's ``(conv_state,)``."""
        return self.mixer(h, cache, attn)

    def mixer_weights(self) -> dict[str, tuple[nn.Module, str, int, int]]:
        """Checkpoint names under the layer -> (module, attribute, first
        row, rows), for :class:`~paternoster.model.llama_weights.LlamaWeights`."""
        c, h = self.mixer, self.mixer.hidden
        return {"conv.in_proj.weight": (c, "in_proj_weight", 0, 3 * h),
                "conv.in_proj.bias": (c, "in_proj_bias", 0, 3 * h),
                "conv.conv.weight": (c, "conv_weight", 0, h),
                "conv.conv.bias": (c, "conv_bias", 0, h),
                "conv.out_proj.weight": (c, "out_proj_weight", 0, h),
                "conv.out_proj.bias": (c, "out_proj_bias", 0, h)}


class Lfm2ForCausalLM(LlamaForCausalLM):
    """LFM2 over a flattened batch (see the module docstring).

    Args and attributes as :class:`~paternoster.model.llama.LlamaForCausalLM`;
    ``kv_caches`` entries of conv layers are their ``(conv_state,)``.
    Raises:
        ValueError: no ``layer_types``, or one naming anything but
            ``"conv"`` / ``"full_attention"``; what the Llama model raises.
    """

    attention_cls = Qwen3Attention
    fused_steps = False
    #: The dense MLP's size follows :func:`ffn_size` (LFM2-MoE's does not).
    adjust_ffn = True

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        self.layer_types = self.layer_types_of(config)
        super().__init__(_Lfm2Config(config, self.adjust_ffn), dtype, ops, max_positions,
                         batch_invariant)

    @staticmethod
    def layer_types_of(config) -> list[str]:
        """Each layer's kind, ``"conv"`` or ``"full_attention"``.

        Raises:
            ValueError: no ``layer_types``, or one of another kind or length.
        """
        types = list(getattr(config, "layer_types", None) or ())
        if len(types) != config.num_hidden_layers or any(
                t not in (CONV, "full_attention") for t in types):
            raise ValueError(f"layer_types must name 'conv' or 'full_attention' for each of "
                             f"the {config.num_hidden_layers} layers, got {types or None}")
        return types

    def make_layer(self, config, dtype: torch.dtype, ops: AttentionOps, index: int,
                   qkv_bias: bool, o_bias: bool, invariant: bool) -> nn.Module:
        """A short-conv layer or the Qwen3 attention block, with
        :meth:`make_mlp`'s feed-forward block."""
        if self.layer_types[index] == CONV:
            return ShortConvDecoderLayer(config, dtype,
                                         self.make_mlp(config, dtype, index, invariant), invariant)
        return super().make_layer(config, dtype, ops, index, qkv_bias, o_bias, invariant)

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> list[str]:
        """As the Llama model's, from LFM2's checkpoint names (``operator_norm``,
        ``feed_forward.w1``, ``embedding_norm``...; conv kernels ``[H, 1, K]``
        or ``[H, K]``)."""
        return super().load_weights(_renamed(weights))


class Lfm2MoeForCausalLM(Lfm2ForCausalLM):
    """LFM2-MoE: the first ``num_dense_layers`` layers with a dense SwiGLU
    MLP of ``intermediate_size`` (no LFM2 adjustment), the others routed
    experts (``feed_forward.experts.{e}.w1/w3/w2``) chosen by sigmoid
    scores plus ``expert_bias``, renormalized with ``norm_topk_prob`` and
    scaled by ``routed_scaling_factor`` (HF ``Lfm2MoeSparseMoeBlock``)."""

    adjust_ffn = False

    def make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        """Layer ``index``'s feed-forward block: dense below
        ``num_dense_layers``, else the routed experts."""
        if index < int(config.num_dense_layers):
            return LlamaMLP(config, dtype, invariant)
        routing = Routing("sigmoid", bool(getattr(config, "use_expert_bias", False)), 1e-6,
                          float(getattr(config, "routed_scaling_factor", 1.0) or 1.0))
        return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size,
                              config.num_experts, config.num_experts_per_tok,
                              bool(getattr(config, "norm_topk_prob", True)), dtype, invariant,
                              ("feed_forward", "w1", "w3", "w2"), routing=routing)


def _renamed(weights: Iterable[tuple[str, Weight]]) -> Iterable[tuple[str, Weight]]:
    for name, tensor in weights:
        if name == "model.embedding_norm.weight":
            name = "model.norm.weight"
        elif name.startswith("model.layers."):
            head, _, rest = name[len("model.layers."):].partition(".")
            rest = _RENAMES.get(rest, rest)
            if rest.startswith("mlp.experts."):  # a GGUF file's stacked experts, unstacked
                _, _, e, proj, leaf = rest.split(".")
                rest = f"feed_forward.experts.{e}.{_EXPERT_PROJS[proj]}.{leaf}"
            conv = rest == "conv.conv.weight" and isinstance(tensor, torch.Tensor)
            if conv and tensor.dim() == 3:  # HF's [H, 1, K]
                tensor = tensor[:, 0, :]
            name = f"model.layers.{head}.{rest}"
        yield name, tensor
