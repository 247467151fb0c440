"""Tensor names of the Mamba2 hybrids' GGUF files (llama.cpp's
``granitehybrid``, ``nemotron_h`` and ``nemotron_h_moe``; its converter's
``GraniteHybridModel`` and ``NemotronHModel``) as the HF names our models
load: the Mamba2 tensors (``ssm_a`` written as ``-exp(A_log)``, ``ssm_d``
and ``ssm_a`` as ``[H, 1]``, the gated norm as ``[G, I / G]``, the conv
kernel squeezed), Granite's shared MLP split into gate, up and down, and
the stacked experts (yielded per expert by :mod:`paternoster.model.gguf`).
"""

from __future__ import annotations

#: The GGUF architectures named here.
MAMBA_ARCHITECTURES = ("granitehybrid", "nemotron_h", "nemotron_h_moe")

_SSM = {"ssm_in.weight": "in_proj.weight", "ssm_conv1d.weight": "conv1d.weight",
        "ssm_conv1d.bias": "conv1d.bias", "ssm_dt.bias": "dt_bias", "ssm_a": "A_log",
        "ssm_d": "D", "ssm_norm.weight": "norm.weight", "ssm_out.weight": "out_proj.weight"}
_ATTENTION = {"attn_q.weight": "q_proj.weight", "attn_k.weight": "k_proj.weight",
              "attn_v.weight": "v_proj.weight", "attn_output.weight": "o_proj.weight"}

_GRANITE = {
    **{k: f"mamba.{v}" for k, v in _SSM.items()},
    **{k: f"self_attn.{v}" for k, v in _ATTENTION.items()},
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate_inp.weight": "block_sparse_moe.router.layer.weight",
    # the shared MLP (the dense models' only feed-forward block), split by the converter
    "ffn_gate_shexp.weight": "shared_mlp.gate_proj.weight",
    "ffn_up_shexp.weight": "shared_mlp.up_proj.weight",
    "ffn_down_shexp.weight": "shared_mlp.output_linear.weight",
    "ffn_gate.weight": "shared_mlp.gate_proj.weight",
    "ffn_up.weight": "shared_mlp.up_proj.weight",
    "ffn_down.weight": "shared_mlp.output_linear.weight",
}
_NEMOTRON = {
    **{k: f"mixer.{v}" for k, v in _SSM.items()},
    **{k: f"mixer.{v}" for k, v in _ATTENTION.items()},
    "attn_norm.weight": "norm.weight",
    "ffn_up.weight": "mixer.up_proj.weight",
    "ffn_down.weight": "mixer.down_proj.weight",
    "ffn_gate_inp.weight": "mixer.gate.weight",
    "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
    "ffn_up_shexp.weight": "mixer.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mixer.shared_experts.down_proj.weight",
}
_GLOBALS = {
    "granitehybrid": {"token_embd.weight": "model.embed_tokens.weight",
                      "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"},
    "nemotron": {"token_embd.weight": "backbone.embeddings.weight",
                 "output_norm.weight": "backbone.norm_f.weight", "output.weight": "lm_head.weight"},
}


def mamba_hybrid_name(arch: str, gguf_name: str) -> str | None:
    """HF's name for a tensor of a ``granitehybrid`` / ``nemotron_h(_moe)``
    file (``blk.0.ssm_in.weight`` -> ``model.layers.0.mamba.in_proj.weight``
    or ``backbone.layers.0.mixer.in_proj.weight``), None for one not loaded
    (the stacked experts are named by the caller)."""
    granite = arch == "granitehybrid"
    glob = _GLOBALS["granitehybrid" if granite else "nemotron"]
    if gguf_name in glob:
        return glob[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    rest = (_GRANITE if granite else _NEMOTRON).get(parts[2])
    if rest is None:
        return None
    return f"{'model' if granite else 'backbone'}.layers.{parts[1]}.{rest}"
