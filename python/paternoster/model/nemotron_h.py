"""Nemotron-H and Nemotron 3 (NVIDIA 2025; HF ``NemotronHForCausalLM``):
hybrids whose blocks each hold one mixer after a pre-norm, with a residual
add (``layer_types``, from the checkpoints' ``hybrid_override_pattern``):

- ``"linear_attention"`` (``M``): Mamba2
  (:class:`~paternoster.model.mamba2.Mamba2Mixer`), its state in the
  recurrent-state group;
- ``"full_attention"`` (``*``): grouped-query attention without positional
  encoding (no RoPE: the Mamba layers carry position);
- ``"mlp"`` (``-``): a non-gated MLP, ``down(relu(up x)^2)``; no cache;
- ``"moe"`` (``E``, Nemotron 3): routed relu² experts chosen by sigmoid
  scores plus a correction bias within the best ``topk_group`` of
  ``n_group`` groups, renormalized and scaled, plus a shared relu² expert,
  optionally through a latent projection; no cache.

Matches HF transformers' class (tests/model/test_nemotron_h.py). Prefix
caching is off (states are not saved at block boundaries); CPU steps run
the Python layers.
"""

from __future__ import annotations

import torch
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.hybrid_model import HybridCausalLM
from paternoster.model.kv_layout import kv_cache_layout
from paternoster.model.llama import LlamaAttention, embed
from paternoster.model.llama_weights import layer_name
from paternoster.model.mamba2 import Mamba2Mixer
from paternoster.model.moe import Routing, SparseMoeBlock
from paternoster.model.olmo2 import OlmoRMSNorm
from paternoster.model.qwen3_next_weights import Target

MAMBA, ATTENTION, MLP, MOE = "linear_attention", "full_attention", "mlp", "moe"


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)^2`` (So et al. 2021, "Primer"; HF's ``relu2``)."""
    return torch.relu(x).square()


class ReluSquaredMLP(nn.Module):
    """``down(relu(up x)^2)``: ``up_weight`` ``[I, H]``, ``down_weight``
    ``[H, I]``, with biases where ``bias`` (else None)."""

    def __init__(self, hidden: int, inter: int, dtype: torch.dtype, bias: bool,
                 invariant: bool) -> None:
        super().__init__()
        self.inter, self.invariant = inter, invariant
        self.up_weight = _param(inter, hidden, dtype=dtype)
        self.down_weight = _param(hidden, inter, dtype=dtype)
        self.up_bias = _param(inter, dtype=dtype) if bias else None
        self.down_bias = _param(hidden, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``."""
        h = relu_squared(kernels.linear(x, self.up_weight, self.up_bias, invariant=self.invariant))
        return kernels.linear(h, self.down_weight, self.down_bias, invariant=self.invariant)


class ReluSquaredExperts(SparseMoeBlock):
    """Non-gated routed experts, ``down_e(relu(up_e x)^2)``
    (``gate_up_weight`` holds the up rows only)."""

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``[n, I]`` -> ``relu(x)^2``."""
        return relu_squared(gate_up)

    def core_activation(self) -> tuple[str, float, float] | None:
        """The core's ``relu2`` (non-gated experts)."""
        return ("relu2", 0.0, 0.0)


class NemotronHMoE(nn.Module):
    """Routed relu² experts plus a shared one (HF ``NemotronHMoE``); the
    routed ones see ``fc1_latent_proj x`` and give ``fc2_latent_proj`` of
    their sum where the config has ``moe_latent_size``."""

    def __init__(self, config, dtype: torch.dtype, invariant: bool) -> None:
        super().__init__()
        h, bias = config.hidden_size, bool(getattr(config, "mlp_bias", False))
        latent = getattr(config, "moe_latent_size", None)
        routing = Routing("sigmoid", True, 1e-20, float(config.routed_scaling_factor or 1.0),
                          int(getattr(config, "n_group", 1) or 1),
                          int(getattr(config, "topk_group", 1) or 1), float32_logits=True)
        self.experts = ReluSquaredExperts(
            latent or h, config.moe_intermediate_size, config.n_routed_experts,
            config.num_experts_per_tok, bool(config.norm_topk_prob), dtype, invariant,
            routing=routing, gated=False)
        if latent:  # the router reads the hidden state, the experts the latent one
            self.experts.router_weight = _param(config.n_routed_experts, h, dtype=dtype)
        self.shared = ReluSquaredMLP(h, config.moe_shared_expert_intermediate_size, dtype, bias,
                                     invariant)
        self.latent_in = _param(latent, h, dtype=dtype) if latent else None
        self.latent_out = _param(h, latent, dtype=dtype) if latent else None
        self.latent_in_bias = _param(latent, dtype=dtype) if latent and bias else None
        self.latent_out_bias = _param(h, dtype=dtype) if latent and bias else None
        self.invariant = invariant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``."""
        if self.latent_in is None:
            return self.experts(x) + self.shared(x)
        weights, ids = self.experts.route(x)
        lat = kernels.linear(x, self.latent_in, self.latent_in_bias, invariant=self.invariant)
        routed = self.experts.combine(lat, weights, ids)
        return (kernels.linear(routed, self.latent_out, self.latent_out_bias,
                               invariant=self.invariant) + self.shared(x))


class NemotronHBlock(nn.Module):
    """``x + mixer(norm(x))`` with one of the four mixers (``kind``)."""

    def __init__(self, config, kind: str, dtype: torch.dtype, ops: AttentionOps,
                 invariant: bool) -> None:
        super().__init__()
        self.kind = kind
        h = config.hidden_size
        self.norm = OlmoRMSNorm(h, config.layer_norm_epsilon, dtype)
        if kind == MAMBA:
            self.mixer = Mamba2Mixer(config, dtype, invariant)
        elif kind == ATTENTION:
            bias = bool(getattr(config, "attention_bias", False))
            self.mixer = LlamaAttention(config, dtype, ops, bias, bias, invariant)
            self.mixer.use_rope = False
        elif kind == MLP:
            self.mixer = ReluSquaredMLP(h, config.intermediate_size, dtype,
                                        bool(getattr(config, "mlp_bias", False)), invariant)
        else:
            self.mixer = NemotronHMoE(config, dtype, invariant)

    def forward(self, x: torch.Tensor, cache, attn: AttentionMetadata) -> torch.Tensor:
        """x ``[T, H]`` -> ``[T, H]``; ``cache``: the attention layer's KV
        cache, the Mamba layer's states, or None."""
        y = self.norm(x)
        if self.kind == MAMBA:
            y = self.mixer(y, cache, attn)
        elif self.kind == ATTENTION:
            y = self.mixer(None, y, cache, attn)
        else:
            y = self.mixer(y)
        return x + y


class NemotronHForCausalLM(HybridCausalLM):
    """Nemotron-H / Nemotron 3 over a flattened batch (see the module docstring).

    Args and attributes as :class:`~paternoster.model.llama.LlamaForCausalLM`;
    ``kv_caches`` entries are KV caches, Mamba states, or None.
    Raises:
        ValueError: a layer type outside the four, an activation other than
            relu² / silu, or what the layers raise.
    """

    torch_ops_elementwise = True

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        super().__init__()
        types = self.layer_types_of(config)
        for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
            if getattr(config, key, want) != want:
                raise ValueError(f"{key} must be {want!r}, got {getattr(config, key)!r}")
        self.config, self.dtype, self.batch_invariant = config, dtype, batch_invariant
        self.layer_types = types
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(NemotronHBlock(config, kind, dtype, ops, batch_invariant)
                                    for kind in types)
        self.norm = OlmoRMSNorm(config.hidden_size, config.layer_norm_epsilon, dtype)
        self.lm_head = self.embed_tokens
        self.set_kv_cache_layout(kv_cache_layout(config))

    @staticmethod
    def layer_types_of(config) -> list[str]:
        """Each block's mixer (``layers_block_type``).

        Raises:
            ValueError: a kind other than the four.
        """
        types = list(getattr(config, "layers_block_type", None) or config.layer_types)
        if any(t not in (MAMBA, ATTENTION, MLP, MOE) for t in types):
            raise ValueError(f"layer types must be {MAMBA!r}, {ATTENTION!r}, {MLP!r} or "
                             f"{MOE!r}, got {types}")
        return types

    def cached_mixer(self, layer: nn.Module) -> nn.Module | None:
        """The Mamba2 or attention mixer; None for the MLP and MoE blocks."""
        return layer.mixer if layer.kind in (MAMBA, ATTENTION) else None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list) -> torch.Tensor:
        """int64[T] ids (positions unused: no RoPE) -> ``[T, H]`` final
        hidden states (model dtype)."""
        x = embed(input_ids, self.embed_tokens, self.dtype)
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cache, attn)
        return self.norm(x)

    def _target(self, name: str) -> Target | None:
        """HF's ``backbone.*`` names onto our parameters (see HybridWeights)."""
        h = self.config.hidden_size
        if name.startswith("backbone."):
            name = "model." + name[len("backbone."):]
        if name == "model.embeddings.weight":
            return self, "embed_tokens", 0, self.config.vocab_size, None
        if name == "lm_head.weight":
            return self, "lm_head", 0, self.config.vocab_size, None
        if name == "model.norm_f.weight":
            return self.norm, "weight", 0, h, None
        found = layer_name(name, len(self.layers))
        if found is None:
            return None
        layer, rest = self.layers[found[0]], found[1]
        if rest == "norm.weight":
            return layer.norm, "weight", 0, h, None
        if rest.startswith("mlp.experts.") and layer.kind == MOE:  # a GGUF file's, unstacked
            return _expert_row(layer.mixer.experts, rest[len("mlp."):])
        if not rest.startswith("mixer."):
            return None
        rest = rest[len("mixer."):]
        table = _MIXER_TABLES[layer.kind](layer.mixer, h)
        target = table.get(rest)
        if target is None and layer.kind == MOE:
            target = _expert_row(layer.mixer.experts, rest)
        if target is None or getattr(target[0], target[1]) is None:
            return None
        return target


def _mamba_table(m: Mamba2Mixer, h: int) -> dict[str, Target]:
    s = m.shape
    rows = m.in_proj_weight.shape[0]
    flat = lambda w: w.reshape(-1)  # noqa: E731 - a GGUF file's [H, 1] and [G, I / G]
    return {"in_proj.weight": (m, "in_proj_weight", 0, rows, None),
            "in_proj.bias": (m, "in_proj_bias", 0, rows, None),
            "conv1d.weight": (m, "conv_weight", 0, s.conv_dim,
                              lambda w: w.reshape(w.shape[0], -1)),
            "conv1d.bias": (m, "conv_bias", 0, s.conv_dim, None),
            "dt_bias": (m, "dt_bias", 0, s.heads, flat),
            "A_log": (m, "A_log", 0, s.heads, flat),
            "D": (m, "D", 0, s.heads, flat),
            "norm.weight": (m, "norm_weight", 0, s.inner, flat),
            "out_proj.weight": (m, "out_weight", 0, h, None),
            "out_proj.bias": (m, "out_bias", 0, h, None)}


def _attention_table(a: LlamaAttention, h: int) -> dict[str, Target]:
    q, kv = a.q_size, a.kv_size
    return {"q_proj.weight": (a, "qkv_weight", 0, q, None),
            "k_proj.weight": (a, "qkv_weight", q, kv, None),
            "v_proj.weight": (a, "qkv_weight", q + kv, kv, None),
            "q_proj.bias": (a, "qkv_bias", 0, q, None),
            "k_proj.bias": (a, "qkv_bias", q, kv, None),
            "v_proj.bias": (a, "qkv_bias", q + kv, kv, None),
            "o_proj.weight": (a, "o_weight", 0, h, None),
            "o_proj.bias": (a, "o_bias", 0, h, None)}


def _mlp_table(m: ReluSquaredMLP, h: int, prefix: str = "") -> dict[str, Target]:
    return {f"{prefix}up_proj.weight": (m, "up_weight", 0, m.inter, None),
            f"{prefix}up_proj.bias": (m, "up_bias", 0, m.inter, None),
            f"{prefix}down_proj.weight": (m, "down_weight", 0, h, None),
            f"{prefix}down_proj.bias": (m, "down_bias", 0, h, None)}


def _moe_table(m: NemotronHMoE, h: int) -> dict[str, Target]:
    e = m.experts
    table = {"gate.weight": (e, "router_weight", 0, e.num_experts, None),
             "gate.e_score_correction_bias": (e, "selection_bias", 0, e.num_experts, None),
             **_mlp_table(m.shared, h, "shared_experts.")}
    if m.latent_in is not None:
        table["fc1_latent_proj.weight"] = (m, "latent_in", 0, m.latent_in.shape[0], None)
        table["fc2_latent_proj.weight"] = (m, "latent_out", 0, h, None)
        table["fc1_latent_proj.bias"] = (m, "latent_in_bias", 0, m.latent_in.shape[0], None)
        table["fc2_latent_proj.bias"] = (m, "latent_out_bias", 0, h, None)
    return table


_MIXER_TABLES = {MAMBA: _mamba_table, ATTENTION: _attention_table, MLP: _mlp_table,
                 MOE: _moe_table}


def _expert_row(e: SparseMoeBlock, rest: str) -> Target | None:
    """``experts.{i}.up_proj.weight`` / ``down_proj.weight`` -> rows of the
    stacked experts."""
    parts = rest.split(".")
    if len(parts) != 4 or parts[0] != "experts" or not parts[1].isdigit():
        return None
    i = int(parts[1])
    if i >= e.num_experts or parts[3] != "weight":
        return None
    if parts[2] == "up_proj":
        return e, "gate_up_weight", i * e.up_rows, e.up_rows, None
    if parts[2] == "down_proj":
        return e, "down_weight", i * e.hidden, e.hidden, None
    return None
