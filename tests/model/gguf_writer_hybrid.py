"""Write a GGUF file from an HF Qwen3-Next / Qwen3.5 model the way llama.cpp's
converter does (``conversion/qwen.py``: ``Qwen3NextModel`` and, for Qwen3.5,
``_LinearAttentionVReorderBase``; checked on its output for tiny random
checkpoints: logits within 3e-5 of HF's, and those files against
llama-server with bench/gguf_agreement.py):

- RMSNorm weights stored as ``1 + w`` (all but the gated norm), ``A_log`` as
  ``ssm_a = -exp(A_log)``, the conv kernel squeezed to ``[C, K]``;
- Qwen3-Next's ``in_proj_qkvz`` (interleaved per key head) split into
  ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (z); ``in_proj_ba``
  written as it is (``ssm_ba``);
- Qwen3.5's value heads reordered from grouped by key head to tiled over
  the key heads in every value-head-indexed row (v, z, b, a, the conv's v
  channels, ``dt_bias``, ``A_log``) and in ``out_proj``'s columns.

Matrices are quantized with gguf-py's quantizer; the returned reference is
HF's state dict with each tensor as the file holds it (dequantized by gguf-py),
moved back to HF's layout.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGUFWriter

from .gguf_writer import (
    _write_experts,
    _write_tokenizer,
    finish,
    write_model_keys,
    write_tensor,
)

_PLAIN = {  # HF suffix under model.layers.N -> GGUF name under blk.N
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}


def write_hybrid_gguf(hf_model, path: Path, arch: str, matrix_type: str = "q8_0",
                      mtp_layers: int = 0) -> dict[str, torch.Tensor]:
    """Write ``hf_model`` (``Qwen3NextForCausalLM`` with ``arch="qwen3next"``,
    ``Qwen3_5ForCausalLM`` with ``"qwen35"``, ``Qwen3_5MoeForCausalLM`` with
    ``"qwen35moe"``) to ``path``; matrices in ``matrix_type``, routers,
    norms and the Gated DeltaNet's vectors and conv kernel in F32. With
    ``mtp_layers``, that many multi-token-prediction layers after the model's
    (counted in ``block_count``, ``nextn_predict_layers`` saying how many; random
    ``blk.N.nextn.eh_proj`` and ``blk.N.attn_norm`` tensors for each), as the
    converter appends a checkpoint's ``mtp.*`` block.

    Returns:
        The HF state dict with every tensor as the file holds it, in HF's layout.
    """
    cfg = hf_model.config
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    tiled = arch != "qwen3next" and hv != hk
    w = GGUFWriter(str(path), arch)
    _write_keys(w, cfg, arch, mtp_layers)
    _write_tokenizer(w, cfg.vocab_size)
    h = cfg.hidden_size
    for i in range(cfg.num_hidden_layers, cfg.num_hidden_layers + mtp_layers):
        w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", np.ones((h, 2 * h), np.float32))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))

    def put(name: str, array: np.ndarray, kind: str) -> np.ndarray:
        return write_tensor(w, name, array, kind if np.ndim(array) == 2 else "f32")

    def heads(x: np.ndarray, axis: int, size: int, back: bool = False) -> np.ndarray:
        """Value heads along ``axis`` (``size`` values each) grouped -> tiled
        (``back``: tiled -> grouped); unchanged unless Qwen3.5 with Hv > Hk."""
        if not tiled:
            return x
        r = hv // hk
        x = np.moveaxis(x, axis, 0)
        shape = (r, hk) if back else (hk, r)
        x = x.reshape(*shape, size, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
        return np.moveaxis(x, 0, axis)

    ref: dict[str, torch.Tensor] = {}
    key_dim = hk * dk
    for name, tensor in hf_model.state_dict().items():
        a = tensor.float().numpy()
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            out = put("token_embd.weight" if "embed" in name else "output.weight", a, matrix_type)
        elif name == "model.norm.weight":
            out = put("output_norm.weight", a + 1.0, "f32") - 1.0
        else:
            at, rest = "blk." + name.split(".")[2], ".".join(name.split(".")[3:])
            if rest.startswith("mlp.experts."):  # fused [E, 2I, H] / [E, H, I]
                ref[name] = _write_experts(w, name, tensor, matrix_type)
                continue
            if rest == "linear_attn.in_proj_qkvz.weight":  # per key head [q, k, v, z]
                r = hv // hk
                per = a.reshape(hk, 2 * dk + 2 * r * dv, -1)
                q, k, v, z = np.split(per, np.cumsum([dk, dk, r * dv]), axis=1)
                flat = [x.reshape(-1, a.shape[-1]) for x in (q, k, v, z)]
                qkv = put(f"{at}.attn_qkv.weight", np.concatenate(flat[:3]), matrix_type)
                zz = put(f"{at}.attn_gate.weight", flat[3], matrix_type)
                pieces = [qkv[:key_dim], qkv[key_dim:2 * key_dim], qkv[2 * key_dim:], zz]
                out = np.concatenate([p.reshape(hk, -1, a.shape[-1]) for p in pieces],
                                     axis=1).reshape(a.shape)
            elif rest == "linear_attn.in_proj_ba.weight":
                out = put(f"{at}.ssm_ba.weight", a, matrix_type)
            elif rest == "linear_attn.in_proj_qkv.weight":
                qk, v = a[:2 * key_dim], heads(a[2 * key_dim:], 0, dv)
                out = put(f"{at}.attn_qkv.weight", np.concatenate([qk, v]), matrix_type)
                out = np.concatenate([out[:2 * key_dim], heads(out[2 * key_dim:], 0, dv, True)])
            elif rest in ("linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight",
                          "linear_attn.in_proj_a.weight"):
                gguf = {"z": "attn_gate", "b": "ssm_beta", "a": "ssm_alpha"}[rest[-8]]
                size = dv if gguf == "attn_gate" else 1
                kind = matrix_type if gguf == "attn_gate" else "f32"
                out = heads(put(f"{at}.{gguf}.weight", heads(a, 0, size), kind), 0, size, True)
            elif rest == "linear_attn.conv1d.weight":  # [C, 1, K]
                c = a.reshape(a.shape[0], -1)
                c = np.concatenate([c[:2 * key_dim], heads(c[2 * key_dim:], 0, dv)])
                out = put(f"{at}.ssm_conv1d.weight", c, "f32")
                out = np.concatenate([out[:2 * key_dim], heads(out[2 * key_dim:], 0, dv, True)])
                out = out.reshape(a.shape)
            elif rest == "linear_attn.dt_bias":
                out = heads(put(f"{at}.ssm_dt.bias", heads(a, 0, 1), "f32"), 0, 1, True)
            elif rest == "linear_attn.A_log":
                stored = put(f"{at}.ssm_a", -np.exp(heads(a, 0, 1)), "f32")
                out = heads(np.log(-stored), 0, 1, True)
            elif rest == "linear_attn.out_proj.weight":  # columns are value channels
                out = heads(put(f"{at}.ssm_out.weight", heads(a, 1, dv), matrix_type), 1, dv, True)
            elif rest.endswith("norm.weight") and rest != "linear_attn.norm.weight":
                out = put(f"{at}.{_PLAIN[rest]}", a + 1.0, "f32") - 1.0
            else:
                router = rest in ("mlp.gate.weight", "mlp.shared_expert_gate.weight")
                out = put(f"{at}.{_PLAIN[rest]}", a, "f32" if router else matrix_type)
        ref[name] = torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))
    finish(w)
    if cfg.tie_word_embeddings:
        ref["lm_head.weight"] = ref["model.embed_tokens.weight"]
    return ref


def _write_keys(w: GGUFWriter, cfg, arch: str, mtp_layers: int) -> None:
    """The ``{arch}.*`` keys the converter writes."""
    types = list(cfg.layer_types) + ["full_attention"] * mtp_layers
    rope = cfg.rope_parameters
    write_model_keys(w, cfg, rope["rope_theta"], cfg.num_hidden_layers + mtp_layers)
    if mtp_layers:
        w.add_uint32(f"{arch}.nextn_predict_layers", mtp_layers)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    if getattr(cfg, "num_experts", None):
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    w.add_array(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in types])
    w.add_full_attention_interval(4)
    w.add_rope_dimension_count(int(cfg.head_dim * rope.get("partial_rotary_factor", 0.25)))
    w.add_file_type(1)
