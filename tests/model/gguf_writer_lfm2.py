"""Write a GGUF file from an HF LFM2 / LFM2-MoE model the way llama.cpp's
converter does (``conversion/lfm2.py``, ``LFM2Model`` and ``LFM2MoeModel``):

- ``attention.head_count_kv`` per layer, 0 on the conv layers;
  ``shortconv.l_cache``; for LFM2 ``feed_forward_length`` the MLP's final
  size (the converter's adjustment, which always rounds up to
  ``block_multiple_of``);
- LFM2-MoE: expert count, used count and width, the leading dense block
  count, sigmoid gating; ``expert_bias`` as ``exp_probs_b.bias``; each
  layer's experts stacked into ``ffn_{gate,up,down}_exps``;
- the conv kernel squeezed to ``[H, K]``; names from gguf-py's table.

Matrices are quantized with gguf-py's quantizer; the returned reference is
HF's state dict with each tensor as the file holds it (dequantized).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import ExpertGatingFuncType, GGUFWriter

from .gguf_writer import _table_name, _write_experts, _write_tokenizer, finish, write_tensor


def write_lfm2_gguf(hf_model, path: Path, matrix_type: str = "q8_0") -> dict[str, torch.Tensor]:
    """Write ``hf_model`` (``Lfm2ForCausalLM`` or ``Lfm2MoeForCausalLM``) to
    ``path``: matrices in ``matrix_type``, norms, the conv kernels, routers
    and the expert bias in F32. Returns the reference state dict."""
    cfg = hf_model.config
    moe = cfg.model_type == "lfm2_moe"
    arch = "lfm2moe" if moe else "lfm2"
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size if moe else _lfm2_ff(cfg))
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([0 if t == "conv" else cfg.num_key_value_heads
                         for t in cfg.layer_types])
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_shortconv_l_cache(cfg.conv_L_cache)
    if moe:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_leading_dense_block_count(cfg.num_dense_layers)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    w.add_file_type(1)
    _write_tokenizer(w, cfg.vocab_size)
    reference: dict[str, torch.Tensor] = {}
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if ".experts." in name:  # transformers 5's fused [E, 2I, H] / [E, H, I]
            reference[name] = _write_experts(w, name, tensor, matrix_type)
            continue
        array = tensor.float().numpy()
        if name.endswith("conv.conv.weight"):
            array = array[:, 0, :]
        if name.endswith("expert_bias"):
            gguf_name = f"blk.{name.split('.')[2]}.exp_probs_b.bias"
        else:
            gguf_name = _table_name(arch, cfg.num_hidden_layers, name)
        assert gguf_name is not None, name
        kind = (matrix_type if array.ndim == 2 and "conv.conv" not in name
                and not name.endswith("feed_forward.gate.weight") else "f32")
        values = write_tensor(w, gguf_name, array, kind)
        reference[name] = torch.from_numpy(np.ascontiguousarray(values, np.float32)).reshape(
            tensor.shape)
    finish(w)
    if cfg.tie_word_embeddings:
        reference["lm_head.weight"] = reference["model.embed_tokens.weight"]
    return reference


def _lfm2_ff(cfg) -> int:
    """The converter's MLP size (``LFM2Model._add_feed_forward_length``)."""
    ff = cfg.intermediate_size
    if cfg.block_auto_adjust_ff_dim:
        ff = int(2 * ff / 3)
        if cfg.block_ffn_dim_multiplier is not None:
            ff = int(cfg.block_ffn_dim_multiplier * ff)
        ff = cfg.block_multiple_of * ((ff + cfg.block_multiple_of - 1) // cfg.block_multiple_of)
    return ff
