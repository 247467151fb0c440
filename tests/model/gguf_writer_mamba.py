"""Write a GGUF file from an HF Granite 4.0-H or Nemotron-H checkpoint
directory the way llama.cpp's converter does (``conversion/granite.py``
``GraniteHybridModel``, ``conversion/nemotron.py`` ``NemotronHModel``, over
``conversion/mamba.py`` ``Mamba2Model``; checked on the converter's own
files for tiny checkpoints: logits within 6.2e-7 of HF's range):

- keys: per-layer ``attention.head_count_kv`` (0 off the attention layers),
  the ``ssm.*`` sizes (``time_step_rank`` = heads, ``inner_size`` = heads x
  head size), Granite's multipliers as ``*_scale`` and ``rope.scaling.finetuned``
  False (no RoPE), Nemotron's per-layer ``feed_forward_length`` and expert keys;
- tensors: ``A_log`` as ``ssm_a = -exp(A_log)`` of shape ``[H, 1]``, ``D``
  as ``[H, 1]``, the gated norm as ``[G, I / G]``, the conv kernel squeezed,
  q/k rows permuted (the converter's ``undo_permute``), Granite's fused
  expert and shared-MLP gate/up split, Nemotron's per-expert matrices
  stacked; names from gguf-py's table.

Everything in F32 (the file holds HF's weights exactly, but for ``-exp``
and ``log``), so the reference is the HF model itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from safetensors.torch import load_file

from .gguf_writer import _table_name, _write_tokenizer, finish, permute

_SSM = {"in_proj.weight": "ssm_in.weight", "conv1d.weight": "ssm_conv1d.weight",
        "conv1d.bias": "ssm_conv1d.bias", "dt_bias": "ssm_dt.bias", "A_log": "ssm_a",
        "D": "ssm_d", "norm.weight": "ssm_norm.weight", "out_proj.weight": "ssm_out.weight"}


def write_mamba_gguf(ckpt: Path, path: Path, arch: str) -> None:
    """Convert the checkpoint in ``ckpt`` (``GraniteMoeHybridForCausalLM``
    with ``arch="granitehybrid"``, ``NemotronHForCausalLM`` with
    ``"nemotron_h"`` or ``"nemotron_h_moe"``) to ``path``."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(ckpt)
    tensors = load_file(str(ckpt / "model.safetensors"))
    types = list(cfg.layers_block_type)
    layers = len(types)
    granite = arch == "granitehybrid"
    heads = cfg.mamba_n_heads if granite else cfg.mamba_num_heads
    head_dim = cfg.mamba_d_head if granite else cfg.mamba_head_dim
    groups = cfg.mamba_n_groups if granite else cfg.n_groups
    w = GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(2**20)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv([cfg.num_key_value_heads if t == "full_attention" else 0 for t in types])
    w.add_ssm_conv_kernel(cfg.mamba_d_conv if granite else cfg.conv_kernel)
    w.add_ssm_state_size(cfg.mamba_d_state if granite else cfg.ssm_state_size)
    w.add_ssm_group_count(groups)
    w.add_ssm_inner_size(heads * head_dim)
    w.add_ssm_time_step_rank(heads)
    w.add_rope_scaling_finetuned(False)
    w.add_vocab_size(cfg.vocab_size)
    if granite:
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_shared_feed_forward_length(cfg.shared_intermediate_size)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    else:
        moe = arch == "nemotron_h_moe"
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        width = {"mlp": cfg.intermediate_size, "moe": getattr(cfg, "moe_intermediate_size", 0)}
        w.add_feed_forward_length([width.get(t, 0) for t in types])
        if moe:
            w.add_expert_count(cfg.n_routed_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
            w.add_expert_group_count(cfg.n_group)
            w.add_expert_group_used_count(cfg.topk_group)
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
            w.add_expert_shared_feed_forward_length(cfg.moe_shared_expert_intermediate_size)
            w.add_expert_weights_norm(bool(cfg.norm_topk_prob))
            w.add_expert_weights_scale(float(cfg.routed_scaling_factor))
    w.add_file_type(0)
    _write_tokenizer(w, cfg.vocab_size)
    experts: dict[str, list[np.ndarray]] = {}
    for name, t in tensors.items():
        a = t.float().numpy()
        parts = name.split(".")
        bid = parts[2] if parts[1] == "layers" else None
        rest = ".".join(parts[4:]) if bid is not None else ""
        mixer = ".".join(parts[3:]) if bid is not None else ""
        out: list[tuple[str, np.ndarray]] = []
        if bid is not None and (mixer.startswith("mamba.") or types[int(bid)] == "linear_attention"
                                and mixer.startswith("mixer.")):
            key = _SSM[rest]
            if rest == "A_log":
                a = -np.exp(a)
            if rest in ("A_log", "D"):
                a = a.reshape(-1, 1)
            elif rest == "norm.weight":
                a = a.reshape(groups, -1)
            elif rest == "conv1d.weight":
                a = a[:, 0, :]
            out = [(f"blk.{bid}.{key}", a)]
        elif granite and "block_sparse_moe.input_linear" in name:
            i = a.shape[1] // 2
            out = [(f"blk.{bid}.ffn_gate_exps.weight", a[:, :i]),
                   (f"blk.{bid}.ffn_up_exps.weight", a[:, i:])]
        elif granite and "block_sparse_moe.output_linear" in name:
            out = [(f"blk.{bid}.ffn_down_exps.weight", a)]
        elif granite and "block_sparse_moe.router" in name:
            out = [(f"blk.{bid}.ffn_gate_inp.weight", a)]
        elif granite and "shared_mlp" in name:
            sfx = "_shexp" if cfg.num_local_experts else ""
            if "input_linear" in name:
                s = a.shape[0] // 2
                out = [(f"blk.{bid}.ffn_gate{sfx}.weight", a[:s]),
                       (f"blk.{bid}.ffn_up{sfx}.weight", a[s:])]
            else:
                out = [(f"blk.{bid}.ffn_down{sfx}.weight", a)]
        elif not granite and ".experts." in name:  # per expert: stacked once all are seen
            key = f"blk.{bid}.ffn_{parts[6].split('_')[0]}_exps.weight"
            experts.setdefault(key, []).append((int(parts[5]), a))
            if len(experts[key]) == cfg.n_routed_experts:
                out = [(key, np.stack([m for _, m in sorted(experts.pop(key))]))]
        elif not granite and name.endswith("e_score_correction_bias"):
            out = [(f"blk.{bid}.exp_probs_b.bias", a)]
        else:
            gguf_name = _table_name(arch, layers, name)
            assert gguf_name is not None, name
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                a = permute(a, cfg.num_attention_heads if "q_proj" in name
                            else cfg.num_key_value_heads)
            out = [(gguf_name, a)]
        for gguf_name, array in out:
            w.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    assert not experts
    finish(w)

