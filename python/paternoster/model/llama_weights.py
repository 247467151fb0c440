"""Loading checkpoint tensors into the Llama-family model's fused parameters
(:class:`~paternoster.model.llama.LlamaForCausalLM` inherits this): HF names
mapped onto the fused q/k/v and gate/up matrices, shape checks, the tied LM
head, and GGUF-quantized weights kept quantized
(:class:`~paternoster.kernels.QuantizedWeight`) or dequantized where their
parts cannot be stacked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from paternoster.kernels import QuantizedWeight, WeightParts
from paternoster.model.moe import SparseMoeBlock

Weight = torch.Tensor | QuantizedWeight | WeightParts

logger = logging.getLogger(__name__)

#: A layer's RMSNorms by checkpoint name: the Llama block has the first two,
#: Gemma 3 all four, OLMo 2 and EXAONE 4 the two after the sub-blocks.
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")

#: Where a vision-language checkpoint keeps its text tower (transformers 5's
#: names, then 4.x's), and what the causal LM calls it.
_TEXT_TOWER_NAMES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                     ("language_model.lm_head.", "lm_head."))


def text_tower_name(name: str) -> str:
    """A vision-language checkpoint's text-tower tensor name as the causal
    LM's (``model.language_model.layers.0...`` -> ``model.layers.0...``);
    other names unchanged."""
    for prefix, plain in _TEXT_TOWER_NAMES:
        if name.startswith(prefix):
            return plain + name[len(prefix):]
    return name


class LlamaWeights:
    """The weight-loading half of the Llama-family model; expects ``config``,
    ``dtype``, ``layers``, ``norm``, ``embed_tokens`` and ``lm_head`` on the
    model (see :class:`~paternoster.model.llama.LlamaForCausalLM`)."""

    def _targets(self, name: str) -> tuple[nn.Module, str, int, int] | None:
        """Map an HF tensor name to (module, attribute, first row, row count) or None."""
        if name == "model.embed_tokens.weight":
            return self, "embed_tokens", 0, self.config.vocab_size
        if name == "model.norm.weight":
            return self.norm, "weight", 0, self.config.hidden_size
        found = layer_name(name, len(self.layers))
        if found is None:
            return None
        layer, rest = self.layers[found[0]], found[1]
        mlp, h = layer.mlp, self.config.hidden_size
        if isinstance(mlp, SparseMoeBlock) and rest.startswith(mlp.checkpoint_names[0] + "."):
            return _expert_target(mlp, rest)
        table = {
            "mlp.gate_up_proj.weight": (mlp, "gate_up_weight", 0, 2 * mlp.inter),  # Phi-3
            "mlp.gate_proj.weight": (mlp, "gate_up_weight", 0, mlp.inter),
            "mlp.up_proj.weight": (mlp, "gate_up_weight", mlp.inter, mlp.inter),
            "mlp.gate_proj.bias": (mlp, "gate_up_bias", 0, mlp.inter),
            "mlp.up_proj.bias": (mlp, "gate_up_bias", mlp.inter, mlp.inter),
            "mlp.down_proj.weight": (mlp, "down_weight", 0, h),
            "mlp.down_proj.bias": (mlp, "down_bias", 0, h),
        }
        attn = getattr(layer, "self_attn", None)
        table.update(_attention_table(attn, h) if attn is not None else layer.mixer_weights())
        for norm in _LAYER_NORMS:
            if getattr(layer, norm, None) is not None:
                table[f"{norm}.weight"] = (getattr(layer, norm), "weight", 0, h)
        target = table.get(rest)
        if target is None or getattr(target[0], target[1]) is None:
            return None
        return target

    def load_weights(self, weights: Iterable[tuple[str, Weight]]) -> list[str]:
        """Copy HF-named tensors into the (fused) parameters, casting to the model dtype.

        Quantized weights (:class:`~paternoster.kernels.QuantizedWeight`, e.g.
        from a GGUF file) stay quantized: a matrix loaded whole replaces its
        parameter, and the parts of a fused one (q/k/v, gate/up) are stacked
        when they share one format, else dequantized into the dense parameter.

        Args:
            weights: (name, tensor) pairs as in an HF ``LlamaForCausalLM``/
                ``Qwen2ForCausalLM`` state dict (a vision-language
                checkpoint's text-tower names read as those: :func:`text_tower_name`).
        Returns:
            Names that were not used (e.g. ``rotary_emb.inv_freq``).
        Raises:
            ValueError: a tensor has the wrong shape, or a parameter row range
                was never written (missing weight). ``lm_head.weight`` is
                optional: without it (or with ``tie_word_embeddings``) the LM
                head is the embedding matrix.
        """
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        loaded: set[str] = set()
        unused: list[str] = []
        lm_head: Weight | None = None
        parts: dict[tuple[int, str], dict[int, tuple[str, QuantizedWeight]]] = {}
        owners: dict[tuple[int, str], nn.Module] = {}
        for name, tensor in weights:
            name = text_tower_name(name)
            if name == "lm_head.weight":
                if not tied:
                    lm_head = self._lm_head_from(name, tensor)
                continue
            target = self._targets(name)
            if target is None:
                unused.append(name)
                continue
            owner, attr, start, rows = target
            param = getattr(owner, attr)
            if isinstance(tensor, QuantizedWeight):
                check_shape(name, tensor.shape, (rows, *param.shape[1:]))
                if rows == param.shape[0]:
                    replace_weight(owner, attr, tensor)
                else:
                    key = (id(owner), attr)
                    owners[key] = owner
                    parts.setdefault(key, {})[start] = (name, tensor)
            else:
                _copy_rows(name, param, start, rows, tensor)
            loaded.add(name)
        for key, pieces in parts.items():
            stack_quantized(owners[key], key[1], pieces, self.dtype)
        replace_weight(self, "lm_head", lm_head if lm_head is not None else self.embed_tokens)
        missing = self._missing(loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights: {missing[:8]}"
                             + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
        return unused

    def _lm_head_from(self, name: str, tensor: Weight) -> Weight:
        shape = (self.config.vocab_size, self.config.hidden_size)
        if isinstance(tensor, QuantizedWeight):
            check_shape(name, tensor.shape, shape)
            return tensor
        lm_head = nn.Parameter(torch.empty(*shape, dtype=self.dtype,
                                           device=self.norm.weight.device), requires_grad=False)
        _copy_rows(name, lm_head, 0, shape[0], tensor)
        return lm_head

    def dequantize_weights(self) -> int:
        """Replace every quantized weight by a dense parameter in the model
        dtype (for devices without quantized kernels); returns how many."""
        count = 0
        for module in self.modules():
            for attr, value in list(vars(module).items()):
                if isinstance(value, QuantizedWeight | WeightParts):
                    delattr(module, attr)
                    setattr(module, attr, nn.Parameter(value.dequantize(self.dtype),
                                                       requires_grad=False))
                    count += 1
        if getattr(self.config, "tie_word_embeddings", False) or self.lm_head is None:
            replace_weight(self, "lm_head", self.embed_tokens)
        return count

    def quantized_weights(self) -> list[QuantizedWeight | WeightParts]:
        """The weights kept quantized (each once, the tied LM head included once)."""
        found: dict[int, QuantizedWeight | WeightParts] = {}
        for module in self.modules():
            for value in vars(module).values():
                if isinstance(value, QuantizedWeight | WeightParts):
                    found[id(value)] = value
        return list(found.values())

    def _missing(self, loaded: set[str]) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        for i, layer in enumerate(self.layers):
            mlp, at = layer.mlp, f"model.layers.{i}."
            attn = getattr(layer, "self_attn", None)
            rests = [f"{norm}.weight" for norm in _LAYER_NORMS
                     if getattr(layer, norm, None) is not None]
            if attn is not None:
                rests += _attention_names(attn, at, loaded)
            else:  # another token mixer (LFM2's short convolution)
                rests += [rest for rest, (owner, attr, _, _) in layer.mixer_weights().items()
                          if getattr(owner, attr) is not None]
            if isinstance(mlp, SparseMoeBlock):
                prefix, *projs = mlp.checkpoint_names
                leaves = ("weight", "bias") if mlp.router_bias is not None else ("weight",)
                rests += [f"{prefix}.gate.{leaf}" for leaf in leaves]
                if mlp.selection_bias is not None:
                    rests.append(f"{prefix}.expert_bias")
                rests += [f"{prefix}.experts.{e}.{p}.{leaf}"
                          for e in range(mlp.num_experts) for p in projs for leaf in leaves]
            else:
                if at + "mlp.gate_up_proj.weight" in loaded:  # Phi-3
                    rests.append("mlp.gate_up_proj.weight")
                else:
                    rests += ["mlp.gate_proj.weight", "mlp.up_proj.weight"]
                rests.append("mlp.down_proj.weight")
                if mlp.gate_up_bias is not None:
                    rests += [f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
            names += [at + rest for rest in rests]
        return [name for name in names if name not in loaded]


def _attention_table(attn: nn.Module, h: int) -> dict[str, tuple[nn.Module, str, int, int]]:
    """An attention block's checkpoint names (under the layer) -> targets."""
    q, kv = attn.q_size, attn.kv_size
    table = {
        "self_attn.qkv_proj.weight": (attn, "qkv_weight", 0, q + 2 * kv),  # Phi-3: fused
        "self_attn.q_proj.weight": (attn, "qkv_weight", 0, q),
        "self_attn.k_proj.weight": (attn, "qkv_weight", q, kv),
        "self_attn.v_proj.weight": (attn, "qkv_weight", q + kv, kv),
        "self_attn.q_proj.bias": (attn, "qkv_bias", 0, q),
        "self_attn.k_proj.bias": (attn, "qkv_bias", q, kv),
        "self_attn.v_proj.bias": (attn, "qkv_bias", q + kv, kv),
        "self_attn.o_proj.weight": (attn, "o_weight", 0, h),
        "self_attn.o_proj.bias": (attn, "o_bias", 0, h),
    }
    if getattr(attn, "q_norm", None) is not None:  # per head (Qwen3) or whole (OLMo 2)
        table["self_attn.q_norm.weight"] = (attn.q_norm, "weight", 0,
                                            attn.q_norm.weight.shape[0])
        table["self_attn.k_norm.weight"] = (attn.k_norm, "weight", 0,
                                            attn.k_norm.weight.shape[0])
    if getattr(attn, "sinks", None) is not None:  # gpt-oss
        table["self_attn.sinks"] = (attn, "sinks", 0, attn.num_heads)
    return table


def _attention_names(attn: nn.Module, at: str, loaded: set[str]) -> list[str]:
    """The checkpoint names (under the layer) an attention block needs."""
    rests = ["self_attn.o_proj.weight"]
    if at + "self_attn.qkv_proj.weight" in loaded:  # Phi-3: fused in the checkpoint
        rests.append("self_attn.qkv_proj.weight")
    else:
        rests += [f"self_attn.{p}_proj.weight" for p in "qkv"]
    if attn.qkv_bias is not None:
        rests += [f"self_attn.{p}_proj.bias" for p in "qkv"]
    if attn.o_bias is not None:
        rests.append("self_attn.o_proj.bias")
    if getattr(attn, "q_norm", None) is not None:  # Qwen3, Gemma 3, OLMo 2
        rests += [f"self_attn.{p}_norm.weight" for p in "qk"]
    if getattr(attn, "sinks", None) is not None:  # gpt-oss
        rests.append("self_attn.sinks")
    return rests


def layer_name(name: str, num_layers: int) -> tuple[int, str] | None:
    """``model.layers.{i}.{rest}`` -> ``(i, rest)`` for ``i < num_layers``, else None."""
    if not name.startswith("model.layers."):
        return None
    index, _, rest = name[len("model.layers."):].partition(".")
    if not index.isdigit() or int(index) >= num_layers:
        return None
    return int(index), rest


def _expert_target(moe: SparseMoeBlock, rest: str) -> tuple[nn.Module, str, int, int] | None:
    """HF's ``{prefix}.gate.weight`` / ``{prefix}.experts.{e}.{proj}.weight``
    (``moe.checkpoint_names``), and their ``.bias`` where the block has
    biases -> rows of the block's stacked parameters."""
    prefix, gate, up, down = moe.checkpoint_names
    leaves = ("weight", "bias") if moe.router_bias is not None else ("weight",)
    parts = rest.split(".")  # prefix gate leaf, or prefix experts e proj leaf
    if parts == [prefix, "expert_bias"] and moe.selection_bias is not None:  # LFM2-MoE
        return moe, "selection_bias", 0, moe.num_experts
    if len(parts) == 3 and parts[1] == "gate" and parts[2] in leaves:
        return moe, f"router_{parts[2]}", 0, moe.num_experts
    if len(parts) != 5 or parts[1] != "experts" or not parts[2].isdigit() or parts[4] not in leaves:
        return None
    e, i, h, leaf = int(parts[2]), moe.inter, moe.hidden, parts[4]
    if e >= moe.num_experts:
        return None
    return {gate: (moe, f"gate_up_{leaf}", e * 2 * i, i),
            up: (moe, f"gate_up_{leaf}", e * 2 * i + i, i),
            down: (moe, f"down_{leaf}", e * h, h)}.get(parts[3])


def stack_quantized(owner: nn.Module, attr: str,
                    pieces: dict[int, tuple[str, QuantizedWeight]], dtype: torch.dtype) -> None:
    """A fused parameter from quantized parts (first row -> (name, part)):
    kept as the parts, where they lie and in their own formats
    (:class:`~paternoster.kernels.WeightParts`), when they cover every row;
    else (a fused parameter some of whose rows came dense) each part
    dequantized to ``dtype`` into the dense parameter."""
    param = getattr(owner, attr)
    ordered = [pieces[s] for s in sorted(pieces)]
    weights = [w for _, w in ordered]
    rows = sum(w.shape[0] for w in weights)
    if rows == param.shape[0]:
        replace_weight(owner, attr, WeightParts(tuple(weights)))
        return
    logger.info("%s: parts in formats %s dequantized to %s", attr,
                sorted({w.format for w in weights}), dtype)
    for start in sorted(pieces):
        name, w = pieces[start]
        _copy_rows(name, param, start, w.shape[0], w.dequantize(dtype))


def _copy_rows(name: str, param: torch.Tensor, start: int, rows: int,
               tensor: torch.Tensor) -> None:
    check_shape(name, tensor.shape, (rows, *param.shape[1:]))
    param.data[start : start + rows].copy_(tensor)


def check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise ValueError(f"weight {name} has shape {tuple(shape)}, expected {tuple(expected)}")


def replace_weight(owner: nn.Module, attr: str, weight: Weight) -> None:
    """Set a weight attribute: a parameter stays registered as one, a
    quantized weight replaces the parameter by a plain attribute."""
    if attr in owner._parameters and not isinstance(weight, nn.Parameter):
        delattr(owner, attr)
    setattr(owner, attr, weight)


def quant_method(config) -> str | None:
    """``config.quantization_config``'s ``quant_method`` (a dict or an object,
    as transformers keeps it), or None without one."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(
        quant, "quant_method", None)
    return str(getattr(method, "value", method)) if method is not None else None
