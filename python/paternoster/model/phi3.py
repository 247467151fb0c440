"""Phi-3 (Abdin et al. 2024, "Phi-3 Technical Report"): the Llama block with
the q/k/v and gate/up projections stored fused in the checkpoint
(``qkv_proj``, ``gate_up_proj``: the layout our layers use anyway, loaded
whole by :class:`~paternoster.model.llama_weights.LlamaWeights`) and an
untied LM head.

Matches HF transformers' ``Phi3ForCausalLM`` (tests/model/test_phi3.py) for
checkpoints with full-dimension RoPE without scaling (Phi-3-mini-4k,
Phi-3-medium-4k); Phi-3-mini-4k's sliding window (2047) runs through the KV
cache groups as Mistral's (:mod:`paternoster.model.kv_layout`). LongRoPE
scaling (the 128k variants, Phi-3.5) and partial rotation (Phi-4-mini,
``partial_rotary_factor`` 0.75) are refused by the RoPE setup with the
reason.
"""

from __future__ import annotations

from paternoster.model.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3 mini/medium with default RoPE (see the module docstring).

    Raises:
        ValueError: an unsupported rope type or partial rotation, or what
            :class:`~paternoster.model.llama.LlamaForCausalLM` raises.
    """
