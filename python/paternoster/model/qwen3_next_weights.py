"""Loading Qwen3-Next / Qwen3.5 checkpoints into
:class:`~paternoster.model.qwen3_next.Qwen3NextForCausalLM` (this class is its
weight-loading half).

HF names are mapped onto our fused parameters: the gated attention's
q (with its gate), k and v into one matrix; Gated DeltaNet's input
projections into one ``[q, k, v, z, b, a]`` matrix. Qwen3-Next stores
``in_proj_qkvz`` and ``in_proj_ba`` interleaved per key head (for each key
head: its q, its k, then the v and z of the value heads it serves; b and a
likewise), which is undone at load; Qwen3.5 stores ``in_proj_qkv``,
``in_proj_z``, ``in_proj_b`` and ``in_proj_a`` apart. The released Qwen3.5
checkpoints are vision-language models: their text tower's tensors
(``model.language_model.*``) are read and the vision tower (``model.visual.*``)
and multi-token-prediction head (``mtp.*``) ignored.

A GGUF file (llama.cpp's ``qwen3next`` / ``qwen35`` / ``qwen35moe``,
:mod:`paternoster.model.gguf`) arrives under the Qwen3.5 names; its
quantized matrices are kept quantized (the parts of a fused matrix as
:class:`~paternoster.kernels.WeightParts`), row reorderings moving whole
quantized rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from paternoster.kernels import QuantizedWeight
from paternoster.model.llama_weights import (
    LlamaWeights,
    Weight,
    _expert_target,
    layer_name,
    replace_weight,
    stack_quantized,
    text_tower_name,
)

#: (module, attribute, first row, rows, transform of the checkpoint tensor:
#: dense, or quantized rows for the row reorderings).
Target = tuple[nn.Module, str, int, int, Callable[[Weight], Weight] | None]


class HybridWeights:
    """The weight-loading half of the hybrid model; expects ``config``,
    ``dtype``, ``layers``, ``norm``, ``embed_tokens`` and ``lm_head``."""

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> list[str]:
        """Copy HF-named tensors into the parameters, cast to the model dtype;
        quantized ones (:class:`~paternoster.kernels.QuantizedWeight`, from a
        GGUF file) kept quantized, the parts of a fused matrix as
        :class:`~paternoster.kernels.WeightParts` (as the Llama loader does).

        Args:
            weights: (name, tensor) pairs of an HF ``Qwen3NextForCausalLM``,
                ``Qwen3_5(Moe)ForCausalLM`` or ``Qwen3_5(Moe)ForConditionalGeneration``
                state dict.
        Returns:
            Names not used.
        Raises:
            ValueError: a tensor of the wrong shape, a quantized checkpoint
                (``quantization_config``: FP8/AWQ/GPTQ scales are not read), or
                a parameter not fully written (a missing weight).
        """
        quant = getattr(self.config, "quantization_config", None)
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else quant
            raise ValueError(f"quantized checkpoints ({method}) are not supported for "
                             f"{type(self).__name__}: use the bfloat16 weights")
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        written: dict[tuple[int, str], int] = {}
        unused: list[str] = []
        untied_head = False
        parts: dict[tuple[int, str], dict[int, tuple[str, QuantizedWeight]]] = {}
        owners: dict[tuple[int, str], nn.Module] = {}
        for name, tensor in weights:
            name = text_tower_name(name)
            if name == "lm_head.weight":
                if tied:
                    continue
                if not untied_head:
                    shape = (self.config.vocab_size, self.config.hidden_size)
                    # (on the embedding's device: load_model builds the model
                    # under torch.device, not this loading)
                    self.lm_head = nn.Parameter(torch.empty(
                        shape, dtype=self.dtype, device=self.embed_tokens.device),
                        requires_grad=False)
                    untied_head = True
            target = self._target(name)
            if target is None:
                unused.append(name)
                continue
            owner, attr, start, rows, transform = target
            param = getattr(owner, attr)
            value = transform(tensor) if transform is not None else tensor
            expected = (rows, *param.shape[1:])
            if tuple(value.shape) != expected:
                raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected "
                                 f"{expected} (after reordering)")
            key = (id(owner), attr)
            if not isinstance(value, QuantizedWeight):
                param.data[start : start + rows].copy_(value)
            elif rows == param.shape[0]:
                replace_weight(owner, attr, value)
            else:
                owners[key] = owner
                parts.setdefault(key, {})[start] = (name, value)
            written[key] = written.get(key, 0) + rows
        for key, pieces in parts.items():
            stack_quantized(owners[key], key[1], pieces, self.dtype)
        if not untied_head:
            replace_weight(self, "lm_head", self.embed_tokens)
        missing = [f"{pname}" for pname, owner, attr, param in self._all_params()
                   if written.get((id(owner), attr), 0) < param.shape[0]]
        if missing:
            raise ValueError(f"checkpoint is missing weights for: {missing[:8]}"
                             + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
        return unused

    #: The weights kept quantized (each once), and their dequantization for
    #: devices without quantized kernels: as the Llama family's.
    quantized_weights = LlamaWeights.quantized_weights
    dequantize_weights = LlamaWeights.dequantize_weights

    def _all_params(self):
        """(name, owner, attribute, parameter) of every parameter to load
        (the LM head only when untied)."""
        tied = self.lm_head is self.embed_tokens
        for module_name, module in self.named_modules():
            for attr, param in module._parameters.items():
                if param is None or (module is self and attr == "lm_head" and tied):
                    continue
                yield f"{module_name}.{attr}".lstrip("."), module, attr, param

    def _target(self, name: str) -> Target | None:
        """Map an HF tensor name onto rows of one of our parameters, or None."""
        if name == "model.embed_tokens.weight":
            return self, "embed_tokens", 0, self.config.vocab_size, None
        if name == "lm_head.weight":
            return self, "lm_head", 0, self.config.vocab_size, None
        if name == "model.norm.weight":
            return self.norm, "weight", 0, self.config.hidden_size, None
        found = layer_name(name, len(self.layers))
        if found is None:
            return None
        layer, rest = self.layers[found[0]], found[1]
        h = self.config.hidden_size
        if rest == "input_layernorm.weight":
            return layer.input_layernorm, "weight", 0, h, None
        if rest == "post_attention_layernorm.weight":
            return layer.post_attention_layernorm, "weight", 0, h, None
        if rest.startswith("self_attn.") and hasattr(layer, "self_attn"):
            return _attention_target(layer.self_attn, rest[len("self_attn."):])
        if rest.startswith("linear_attn.") and hasattr(layer, "linear_attn"):
            return _linear_target(layer.linear_attn, rest[len("linear_attn."):])
        if rest.startswith("mlp."):
            return _mlp_target(layer.mlp, rest)
        return None


def _attention_target(attn, rest: str) -> Target | None:
    q2, kv, d = 2 * attn.q_size, attn.kv_size, attn.head_dim
    table = {
        "q_proj.weight": (attn, "qkv_weight", 0, q2, None),
        "k_proj.weight": (attn, "qkv_weight", q2, kv, None),
        "v_proj.weight": (attn, "qkv_weight", q2 + kv, kv, None),
        "q_proj.bias": (attn, "qkv_bias", 0, q2, None),
        "k_proj.bias": (attn, "qkv_bias", q2, kv, None),
        "v_proj.bias": (attn, "qkv_bias", q2 + kv, kv, None),
        "o_proj.weight": (attn, "o_weight", 0, attn.o_weight.shape[0], None),
        "o_proj.bias": (attn, "o_bias", 0, attn.o_weight.shape[0], None),
        "q_norm.weight": (attn.q_norm, "weight", 0, d, None),
        "k_norm.weight": (attn.k_norm, "weight", 0, d, None),
    }
    target = table.get(rest)
    if target is None or getattr(target[0], target[1]) is None:
        return None
    return target


def _linear_target(net, rest: str) -> Target | None:
    conv, vd, hv = net.conv_dim, net.value_dim, net.hv
    table = {
        # Qwen3-Next: fused and interleaved per key head.
        "in_proj_qkvz.weight": (net, "in_proj_weight", 0, conv + vd, _deinterleave_qkvz(net)),
        "in_proj_ba.weight": (net, "in_proj_weight", conv + vd, 2 * hv, _deinterleave_ba(net)),
        # Qwen3.5: apart.
        "in_proj_qkv.weight": (net, "in_proj_weight", 0, conv, None),
        "in_proj_z.weight": (net, "in_proj_weight", conv, vd, None),
        "in_proj_b.weight": (net, "in_proj_weight", conv + vd, hv, None),
        "in_proj_a.weight": (net, "in_proj_weight", conv + vd + hv, hv, None),
        "conv1d.weight": (net, "conv_weight", 0, conv, lambda w: w.reshape(w.shape[0], -1)),
        "dt_bias": (net, "dt_bias", 0, hv, None),
        "A_log": (net, "A_log", 0, hv, None),
        "norm.weight": (net, "norm_weight", 0, net.dv, None),
        "out_proj.weight": (net, "out_weight", 0, net.out_weight.shape[0], None),
    }
    return table.get(rest)


def _one_row(w: Weight) -> Weight:
    """A dense vector ``[H]`` as the one-row matrix ``[1, H]``."""
    return w.reshape(1, -1) if isinstance(w, torch.Tensor) and w.dim() == 1 else w


def _take_rows(order: torch.Tensor) -> Callable[[Weight], Weight]:
    """A transform taking whole rows in ``order`` (dense or quantized rows:
    the blocks run along a row, so whole rows move)."""

    def take(w: Weight) -> Weight:
        if isinstance(w, QuantizedWeight):
            return QuantizedWeight(w.data[order].contiguous(), w.format, w.in_features)
        return w[order]

    return take


def _deinterleave_qkvz(net) -> Callable[[Weight], Weight]:
    """Qwen3-Next's ``in_proj_qkvz`` rows, per key head ``[q Dk, k Dk, v r Dv,
    z r Dv]`` (``r`` value heads per key head) -> ``[q all, k all, v all, z all]``."""
    r = net.hv // net.hk
    per_head = torch.arange(net.conv_dim + net.value_dim).reshape(net.hk, -1)
    q, k, v, z = per_head.split([net.dk, net.dk, r * net.dv, r * net.dv], dim=1)
    return _take_rows(torch.cat([x.reshape(-1) for x in (q, k, v, z)]))


def _deinterleave_ba(net) -> Callable[[Weight], Weight]:
    """Qwen3-Next's ``in_proj_ba`` rows, per key head ``[b r, a r]`` -> ``[b all, a all]``."""
    r = net.hv // net.hk
    b, a = torch.arange(2 * net.hv).reshape(net.hk, 2 * r).split([r, r], dim=1)
    return _take_rows(torch.cat([b.reshape(-1), a.reshape(-1)]))


def _mlp_target(mlp, rest: str) -> Target | None:
    """``mlp.*`` of a dense layer (SwiGLU) or of routed + shared experts."""
    dense = getattr(mlp, "shared_expert", mlp)
    prefix = "mlp."
    if hasattr(mlp, "shared_expert"):
        if rest == "mlp.shared_expert_gate.weight":  # [1, H]; a GGUF file may hold [H]
            return mlp, "shared_gate_weight", 0, 1, _one_row
        if not rest.startswith("mlp.shared_expert."):
            found = _expert_target(mlp.experts, rest)
            return None if found is None else (*found, None)
        prefix = "mlp.shared_expert."
    i, h = dense.inter, dense.gate_up_weight.shape[1]
    table = {
        prefix + "gate_proj.weight": (dense, "gate_up_weight", 0, i, None),
        prefix + "up_proj.weight": (dense, "gate_up_weight", i, i, None),
        prefix + "down_proj.weight": (dense, "down_weight", 0, h, None),
    }
    return table.get(rest)
