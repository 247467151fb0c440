"""Serve a GGUF file directly: its weights, quantized weights kept quantized
where they lie in the file.

The config (:mod:`paternoster.model.gguf_config`; and, in the frontend, the
tokenizer and chat template) comes from the file's metadata through
transformers' GGUF support; the tensors are read with the ``gguf`` package
(:mod:`paternoster.model.gguf_file`), renamed to HF's names and handed to the
model's ``load_weights``:

- F32, F16, BF16 tensors: dense, cast to the model dtype (copied: norms,
  and the matrices of an unquantized file);
- the types of :data:`QUANTIZED_TYPES` (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q5_1,
  Q4_0, Q4_1, IQ4_NL, IQ4_XS, MXFP4): kept as their GGUF blocks
  (:class:`~paternoster.kernels.QuantizedWeight`) *in the file's memory
  mapping* (copy-on-write, never written): no converted copy on disk, no
  second copy in RAM; computed with directly by the CPU kernels (dequantized
  at load on CUDA, which has no such kernels);
- the other quantized types (Q2_K, Q3_K, the IQ1-IQ3 family, TQ1_0, TQ2_0,
  NVFP4): dequantized at load to bfloat16 by gguf-py's reference, named in one
  log line;
- a type this ``gguf`` package does not know: refused when the file is
  opened, naming the file.

The mapping lives as long as the model: the file must not be truncated or
rewritten while it is served (as with llama.cpp's mmap).

llama.cpp's converter permutes the rows of the q and k projections of Llama
models (its RoPE pairs adjacent dimensions, HF's pairs halves); the rows are
permuted back here (the quantization blocks run along a row, so whole rows
move).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from paternoster.kernels.quant import QuantizedWeight
from paternoster.model.gguf_config import HYBRID_ARCHITECTURES
from paternoster.model.gguf_file import (
    DENSE_TYPES,
    DEQUANTIZED_TYPES,
    QUANTIZED_TYPES,
    file_architecture,
    gguf_reader,
    gguf_shards,
)
from paternoster.model.gguf_mamba import MAMBA_ARCHITECTURES, mamba_hybrid_name

logger = logging.getLogger(__name__)

#: Architectures whose tensor names come from gguf-py's own name table
#: (TensorNameMap, which llama.cpp's converter writes with) read backwards over
#: the HF model's parameter names; the others use :data:`_LAYER_NAMES`.
_NAME_MAP_ARCHITECTURES = ("gemma3", "phi3", "smollm3", "gpt-oss", "olmo2", "exaone4",
                           "mistral3", "lfm2", "lfm2moe")
#: Architectures whose q/k rows llama.cpp's converter permutes (its LlamaModel
#: and subclasses with ``undo_permute``).
_PERMUTED_QK = ("llama", "smollm3", "mistral3", *MAMBA_ARCHITECTURES)
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # qwen3moe: the router
}
#: Stacked expert matrices ([experts, rows, in_features]) and their biases
#: ([experts, rows], gpt-oss) -> HF's per-expert name.
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj",
                 "ffn_down_exps": "down_proj"}
#: The Gated DeltaNet hybrids' layer tensors (llama.cpp's qwen3next / qwen35 /
#: qwen35moe; the full-attention layers' and experts' names are the common
#: ones). ``attn_qkv`` holds q, k and v apart (the converter undoes
#: Qwen3-Next's per-key-head interleaving of in_proj_qkvz; ``ssm_ba`` it
#: leaves interleaved), so they load under Qwen3.5's names.
_HYBRID_LAYER_NAMES = {
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_ba.weight": "linear_attn.in_proj_ba.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log",  # written as -exp(A_log)
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def gguf_weights(path: str | Path,
                 hf_config) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """The tensors of a GGUF file under HF names, quantized ones kept so.

    Args:
        path: the ``.gguf`` file.
        hf_config: its config (:func:`load_gguf_config`), for the head counts
            of the q/k row permutation.
    Yields:
        (HF name, dense tensor or :class:`QuantizedWeight`), rows in HF order.
    Raises:
        ValueError: a tensor type outside :data:`QUANTIZED_TYPES`,
            :data:`DENSE_TYPES` and :data:`DEQUANTIZED_TYPES` (naming the
            tensor and listing them).
    """
    shards = gguf_shards(path)
    reader = gguf_reader(shards[0])
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    arch = file_architecture(reader, path)
    llama = arch in _PERMUTED_QK
    hybrid = arch in HYBRID_ARCHITECTURES
    names = _names_from_table(hf_config, arch) if arch in _NAME_MAP_ARCHITECTURES else None
    layers = hf_config.num_hidden_layers
    dequantized: dict[str, int] = {}
    tensors = [(t, shard) for shard in shards for t in gguf_reader(shard).tensors]
    for t, shard in tensors:
        expert = _expert_tensor(t.name)
        name = (names.get(t.name) if names is not None
                else mamba_hybrid_name(arch, t.name) if arch in MAMBA_ARCHITECTURES
                else hybrid_name(t.name) if hybrid else hf_name(t.name))
        if (name is None and expert is None) or _layer_index(t.name) >= layers:
            continue  # e.g. rope_freqs; multi-token-prediction layers past the model's
        weight = _tensor(t, shard)
        if t.tensor_type.name in DEQUANTIZED_TYPES:
            dequantized[t.tensor_type.name] = dequantized.get(t.tensor_type.name, 0) + 1
        if expert is not None:
            # GGML order (K, rows, E): expert e's matrix is rows [e * rows, (e + 1) * rows);
            # a bias (rows, E) is [E, rows] in HF order.
            layer, proj, leaf = expert
            experts = int(t.shape[-1])
            rows = int(t.shape[1]) if leaf == "weight" else 0
            for e in range(experts):
                part = (weight[e * rows:(e + 1) * rows] if isinstance(weight, QuantizedWeight)
                        else weight[e])
                yield f"model.layers.{layer}.mlp.experts.{e}.{proj}.{leaf}", part
            continue
        if llama and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_rows(weight, heads if "q_proj" in name else kv_heads)
        if (arch == "gemma3" or hybrid) and name.endswith("norm.weight") and (
                not name.endswith("linear_attn.norm.weight")):
            # llama.cpp's converter stores Gemma's and the Qwen3-Next family's
            # RMSNorm weights as 1 + w (its norm multiplies by the weight);
            # ours, as HF's, add the 1. (The gated norm is a plain weight.)
            weight = weight.float() - 1.0
        if name.endswith(".A_log"):  # the converter writes -exp(A_log)
            weight = torch.log(-weight.float())
        yield name, weight
    if dequantized:
        logger.info("%s: dequantized %s to bfloat16 at load (no kernel keeps these types "
                    "quantized; kept quantized: %s)", Path(path).name,
                    ", ".join(f"{n} {k} tensors" for k, n in sorted(dequantized.items())),
                    ", ".join(QUANTIZED_TYPES))


def _tensor(t, path: str | Path) -> torch.Tensor | QuantizedWeight:
    """One GGUF tensor: quantized rows viewing the file's mapping (stacked
    experts' rows back to back), or a dense tensor in HF's dimension order
    (a view of the mapping, for the model to copy; dequantized types: a new
    bfloat16 tensor).

    Raises:
        ValueError: a type outside :data:`QUANTIZED_TYPES`, :data:`DENSE_TYPES`
            and :data:`DEQUANTIZED_TYPES`, or a quantized tensor whose rows do
            not hold whole blocks (naming the file, tensor and type).
    """
    kind = t.tensor_type.name
    shape = [int(d) for d in reversed(t.shape)]  # HF order: [..., rows, in_features]
    if kind in QUANTIZED_TYPES:
        data = torch.from_numpy(t.data)
        try:
            return QuantizedWeight(data.reshape(-1, data.shape[-1]), QUANTIZED_TYPES[kind],
                                   shape[-1], mapped=True)
        except ValueError as e:
            raise ValueError(f"{path}: tensor {t.name} ({kind}, shape {shape}): {e}") from e
    if kind in DENSE_TYPES:
        array = t.data
        if kind == "BF16":
            weight = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        else:
            weight = torch.from_numpy(array)
        return weight.reshape(shape)
    if kind in DEQUANTIZED_TYPES:
        from gguf import quants

        values = quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(values).to(torch.bfloat16).reshape(shape)
    raise ValueError(
        f"{path}: tensor {t.name} has GGUF type {kind}, which is not supported; "
        f"supported: {', '.join([*QUANTIZED_TYPES, *DENSE_TYPES, *DEQUANTIZED_TYPES])}")


def _names_from_table(hf_config, arch: str) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name for the HF model of ``hf_config``:
    gguf-py's TensorNameMap (the table llama.cpp's converter names tensors
    with) applied to every parameter of that model, built on the meta device."""
    import gguf
    import transformers

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    table = gguf.get_tensor_name_map(arch_enum, hf_config.num_hidden_layers)
    config = copy.deepcopy(hf_config)
    config.pad_token_id = None  # a class default past a small vocabulary trips nn.Embedding
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    out = {}
    for key in model.state_dict():
        name = table.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is not None:
            # A parameter without a .weight/.bias suffix is written with one
            # (the converters' filter_tensors): gpt-oss's self_attn.sinks as
            # .weight, LFM2-MoE's feed_forward.expert_bias as .bias.
            if key.endswith((".weight", ".bias")):
                out[name] = key
            else:
                out[f"{name}.weight"] = out[f"{name}.bias"] = key
    return out


def _expert_tensor(gguf_name: str) -> tuple[str, str, str] | None:
    """(layer, HF projection, ``weight`` or ``bias``) of a stacked expert
    tensor (``blk.3.ffn_up_exps.weight`` -> ``("3", "up_proj", "weight")``),
    None for any other."""
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _EXPERT_NAMES:
        return None
    return (parts[1], _EXPERT_NAMES[parts[2]], parts[3]) if parts[3] in ("weight", "bias") else None


def _layer_index(gguf_name: str) -> int:
    """The layer of a ``blk.N.*`` tensor name, -1 for a global tensor."""
    parts = gguf_name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1


def hybrid_name(gguf_name: str) -> str | None:
    """HF's name for a tensor of a Qwen3-Next / Qwen3.5 GGUF file
    (``blk.0.attn_qkv.weight`` -> ``model.layers.0.linear_attn.in_proj_qkv.weight``,
    :data:`_HYBRID_LAYER_NAMES`, else :func:`hf_name`)."""
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _HYBRID_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_HYBRID_LAYER_NAMES[parts[2]]}"
    return hf_name(gguf_name)


def hf_name(gguf_name: str) -> str | None:
    """HF's name for a GGUF tensor name (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``), None for tensors we do not load
    (e.g. ``rope_freqs``)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def unpermute_rows(weight: torch.Tensor | QuantizedWeight,
                   num_heads: int) -> torch.Tensor | QuantizedWeight:
    """Undo llama.cpp's q/k row permutation (rows of each head go from
    interleaved pairs ``(0, d/2), (1, d/2 + 1), ...`` back to halves).

    Args:
        weight: ``[num_heads * head_dim, in_features]`` (dense or quantized rows).
        num_heads: heads of this projection.
    Returns:
        The weight with rows in HF order.
    """
    data = weight.data if isinstance(weight, QuantizedWeight) else weight
    rows = data.shape[0]
    half = rows // num_heads // 2
    # HF row (h, p, j) (p: which half, j: index in it) is GGUF row (h, j, p).
    source = torch.arange(rows).reshape(num_heads, half, 2).transpose(1, 2).reshape(rows)
    moved = data[source].contiguous()
    if isinstance(weight, QuantizedWeight):
        return QuantizedWeight(moved, weight.format, weight.in_features)
    return moved
