"""gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card";
``GptOssForCausalLM``, model_type ``gpt_oss``).

The Llama block with:

- attention with biases on q/k/v and o, grouped-query heads of ``head_dim``,
  and a learned sink logit per head (``self_attn.sinks``): an extra column of
  the softmax that takes probability mass and contributes no value
  (:class:`GptOssAttention`);
- layers alternating between a sliding window (128) and full attention, as
  ``layer_types`` says (the model's KV cache groups,
  :mod:`paternoster.model.kv_layout`);
- YaRN RoPE (:mod:`paternoster.model.rope`);
- a mixture of experts in every layer (:class:`GptOssMoE`): a router with a
  bias, softmax over the top-k logits only, and experts with biases and a
  clamped SwiGLU, ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)`` with
  ``g = min(gate, l)``.

Checkpoints store each layer's experts as fused tensors (transformers'
``GptOssExperts``: ``gate_up_proj`` ``[E, H, 2I]`` whose gate and up columns
are interleaved, ``down_proj`` ``[E, I, H]``, and their biases), in the
released ones quantized to MXFP4 (``*_blocks`` / ``*_scales``,
:mod:`paternoster.model.mxfp4`), dequantized at load. A GGUF file
(llama.cpp's ``gpt-oss`` architecture, :mod:`paternoster.model.gguf`) holds
them as separate gate/up/down stacks, kept quantized (MXFP4 computed on
directly by the CPU kernels).
:func:`split_experts` turns them into the per-expert matrices
:class:`~paternoster.model.moe.SparseMoeBlock` loads.

Matches HF transformers' ``GptOssForCausalLM`` (tests/model/test_gpt_oss.py).
Every step runs the Python layers (the core's decoder stack has no sinks);
on CPU each layer's experts are one core call (paternoster/moe.h). HF keeps
the RMSNorm weights in float32 for bfloat16 models; ours are in the model
dtype, as Llama's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata, AttentionOps, paged_attention_layer
from paternoster.model.llama import KVCache, LlamaAttention, LlamaForCausalLM, _param
from paternoster.model.moe import SparseMoeBlock
from paternoster.model.mxfp4 import dequantize_mxfp4

logger = logging.getLogger(__name__)

_EXPERTS = ".mlp.experts."
_FUSED = ("gate_up_proj", "down_proj")


class GptOssAttention(LlamaAttention):
    """:class:`~paternoster.model.llama.LlamaAttention` with per-head
    attention sinks.

    Attributes:
        sinks: ``[Hq]`` in the model dtype (checkpoint ``self_attn.sinks``):
            head h's softmax over a query's keys also counts ``exp(sinks[h])``
            in its denominator (HF's ``eager_attention_forward`` appends it
            as a last logit and drops its probability).
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.sinks = _param(self.num_heads, dtype=dtype)

    @property
    def sinks_float32(self) -> torch.Tensor:
        """``sinks`` as float32 ``[Hq]``, the attention kernels' dtype for them."""
        return self.sinks.float()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
               attn: AttentionMetadata) -> torch.Tensor:
        """As the Llama layer's (q ``[T, Hq, D]``, k/v ``[T, Hkv, D]`` ->
        ``[T, Hq, D]``), with the sinks in each head's softmax."""
        return paged_attention_layer(self.ops, q, k, v, kv_cache, attn, self.scale,
                                     sliding_window=self.sliding_window, kv_group=self.kv_group,
                                     sinks=self.sinks_float32)


class GptOssMoE(SparseMoeBlock):
    """gpt-oss's experts (HF ``GptOssTopKRouter`` and ``GptOssExperts``) on
    :class:`~paternoster.model.moe.SparseMoeBlock`'s grouped computation and
    parameters, with biases, gate and up de-interleaved at load (each
    expert's gate rows, then its up rows).

    Args:
        config: a ``GptOssConfig`` (``hidden_size``, ``intermediate_size``,
            ``num_local_experts``, ``num_experts_per_tok``, ``swiglu_alpha``,
            ``swiglu_limit``).
    Raises:
        ValueError: a bad ``num_experts_per_tok``, a ``swiglu_limit`` <= 0.
    """

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__(config.hidden_size, config.intermediate_size, config.num_local_experts,
                         config.num_experts_per_tok, True, dtype, invariant,
                         checkpoint_names=("mlp", "gate_proj", "up_proj", "down_proj"),
                         bias=True)
        self.alpha = float(getattr(config, "swiglu_alpha", 1.702))
        self.limit = float(getattr(config, "swiglu_limit", 7.0))
        if not self.limit > 0:
            raise ValueError(f"swiglu_limit must be > 0, got {self.limit}")

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, H]`` -> (weights ``[T, k]`` in x's dtype, expert ids int64
        ``[T, k]``): the top k of the biased router logits, softmax over
        those k (in float32)."""
        logits = self.router_logits(x)
        top, experts = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1).to(x.dtype), experts

    def core_activation(self) -> tuple[str, float, float]:
        """The core's clamped SwiGLU (paternoster/moe.h) with this alpha and
        limit; the routing is the core's renormalized top-k, which is the
        softmax over the top-k logits of :meth:`route`."""
        return ("clamped_swiglu", self.alpha, self.limit)

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``[n, 2I]`` (gate columns, then up) -> ``[n, I]``: the clamped
        SwiGLU of gpt-oss's reference code, ``(up' + 1) * g * sigmoid(alpha * g)``
        with ``g = min(gate, limit)`` and ``up' = clamp(up, -limit, limit)``."""
        gate, up = gate_up.split(self.inter, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss-20b / gpt-oss-120b (see the module docstring).

    Raises:
        ValueError: a ``quantization_config`` other than MXFP4, or what
            :class:`GptOssMoE` and :class:`~paternoster.model.llama.LlamaForCausalLM`
            raise.
    """

    attention_cls = GptOssAttention
    #: The core's decoder stack has no attention sinks.
    fused_steps = False
    #: The released checkpoints' MXFP4 experts (dequantized at load).
    quant_methods = ("mxfp4",)

    def make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        """Every layer's feed-forward block is :class:`GptOssMoE`."""
        return GptOssMoE(config, dtype, invariant)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """As the Llama model's, with the fused (and possibly MXFP4) expert
        tensors split per expert first (:func:`split_experts`).

        Raises:
            ValueError: what :func:`split_experts` and the Llama loader raise.
        """
        return super().load_weights(split_experts(weights, self.dtype))


def split_experts(weights: Iterable[tuple[str, torch.Tensor]],
                  dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """gpt-oss checkpoint tensors -> the names the Llama loader maps.

    ``model.layers.{L}.mlp.router.{weight,bias}`` become ``mlp.gate.*``; the
    fused ``mlp.experts.gate_up_proj`` ``[E, H, 2I]`` (gate columns at even
    indices, up at odd ones: HF ``GptOssExperts._apply_gate``) becomes
    ``mlp.experts.{e}.gate_proj.weight`` and ``up_proj.weight`` ``[I, H]``,
    ``down_proj`` ``[E, I, H]`` becomes ``mlp.experts.{e}.down_proj.weight``
    ``[H, I]``, and their ``*_bias`` ``[E, 2I]`` / ``[E, H]`` likewise. MXFP4
    ``*_blocks`` + ``*_scales`` (the matrix as ``[E, out, in]``) are
    dequantized to ``dtype`` one expert at a time (said in one log line).
    Other tensors pass through.

    Raises:
        ValueError: a fused tensor that is not 3-D (2-D for a bias), MXFP4
            blocks without their scales or the reverse, or what
            :func:`~paternoster.model.mxfp4.dequantize_mxfp4` raises.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    dequantized = 0
    for name, tensor in weights:
        head, sep, leaf = name.rpartition(_EXPERTS)
        if not sep:
            if name.endswith(".mlp.router.weight") or name.endswith(".mlp.router.bias"):
                name = name.replace(".mlp.router.", ".mlp.gate.")
            yield name, tensor
            continue
        proj, _, part = leaf.rpartition("_")
        if proj in _FUSED and part in ("blocks", "scales"):
            parts = pending.setdefault(head + _EXPERTS + proj, {})
            parts[part] = tensor
            if len(parts) == 2:
                del pending[head + _EXPERTS + proj]
                blocks, scales = parts["blocks"], parts["scales"]
                rows = (dequantize_mxfp4(blocks[e], scales[e], dtype)
                        for e in range(blocks.shape[0]))
                yield from _per_expert(head, proj, "weight", rows)
                dequantized += 1
        elif leaf in _FUSED:
            _check_dims(name, tensor, 3)
            yield from _per_expert(head, leaf, "weight", (w.T for w in tensor))
        elif proj in _FUSED and part == "bias":
            _check_dims(name, tensor, 2)
            yield from _per_expert(head, proj, "bias", iter(tensor))
        else:
            yield name, tensor
    if pending:
        raise ValueError(f"MXFP4 weights without their blocks or scales: {sorted(pending)}")
    if dequantized:
        logger.info("dequantized %d MXFP4 expert tensors (OCP MX: E2M1 values, one E8M0 "
                    "scale per 32) to %s at load", dequantized, dtype)


def _per_expert(head: str, proj: str, leaf: str,
                experts: Iterator[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each expert's ``[out, ...]`` slice of fused ``proj`` under its
    per-expert names; gate_up's interleaved rows split into gate and up."""
    for e, w in enumerate(experts):
        at = f"{head}{_EXPERTS}{e}."
        if proj == "gate_up_proj":
            yield f"{at}gate_proj.{leaf}", w[0::2]
            yield f"{at}up_proj.{leaf}", w[1::2]
        else:
            yield f"{at}down_proj.{leaf}", w


def _check_dims(name: str, tensor: torch.Tensor, dims: int) -> None:
    if tensor.dim() != dims:
        raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {dims} "
                         f"dimensions (fused experts first)")
