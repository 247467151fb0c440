"""A Llama-family decoder stack in one call into the C++ core
(``paternoster/decoder.h``): for small CPU decode steps, where calling ~10
kernels a layer from Python costs more than their arithmetic. The core runs
the same kernels in the same order as the Python layers
(:mod:`paternoster.model.llama`), so the results are the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paternoster import _core
from paternoster.kernels.checks import check_tensor
from paternoster.kernels.cpu import CPU_DTYPES, WEIGHT_FORMATS
from paternoster.kernels.moe import CpuMoeExperts
from paternoster.kernels.quant import QuantizedWeight, WeightParts

Weight = torch.Tensor | QuantizedWeight | WeightParts


@dataclass(frozen=True)
class StackLayer:
    """One layer's tensors (see ``paternoster/decoder.h`` for the layouts).

    Attributes:
        input_norm, post_attention_norm: ``[H]`` norm weights.
        qkv, o, gate_up, down: (weight, bias or None); weights dense in the
            model dtype or quantized (gate_up and down unused with ``moe``).
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``.
        q_norm, k_norm: ``[D]`` per-head RMSNorm weights (Qwen3), both or neither.
        use_rope: False for a layer without RoPE (SmolLM3's NoPE layers).
        sliding_window: W > 0: the layer's attention sees each query's last W
            positions (see :func:`paternoster.kernels.paged_attention`); 0:
            full causal attention.
        moe: routed experts as the layer's feed-forward block, or None (the
            SwiGLU MLP of gate_up and down).

    Raises:
        ValueError: a negative ``sliding_window``.
    """

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: tuple[Weight, torch.Tensor | None]
    o: tuple[Weight, torch.Tensor | None]
    gate_up: tuple[Weight, torch.Tensor | None]
    down: tuple[Weight, torch.Tensor | None]
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    use_rope: bool = True
    sliding_window: int = 0
    moe: CpuMoeExperts | None = None

    def __post_init__(self) -> None:
        if self.sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0 (0 = no window), "
                             f"got {self.sliding_window}")


class CpuDecoderStack:
    """The core's decoder stack over a model's tensors (kept referenced).

    Args:
        config: a transformers Llama/Qwen2 config (hidden, heads, head_dim,
            intermediate size, RMSNorm eps).
        dtype: activation dtype (float32 or bfloat16).
        layers: per layer tensors.
        final_norm: ``[H]``.
        cos_sin_cache: the RoPE table ``[max_positions, D]`` (NeoX layout).
        batch_invariant: one attention work item per token.
    Raises:
        ValueError: a tensor of the wrong dtype, device or layout, or sizes the
            core refuses.
    """

    def __init__(self, config, dtype: torch.dtype, layers: list[StackLayer],
                 final_norm: torch.Tensor, cos_sin_cache: torch.Tensor,
                 batch_invariant: bool) -> None:
        if dtype not in CPU_DTYPES:
            raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        cache_shape = check_tensor(layers[0].key_cache, "key_cache", 4, dtype)
        check_tensor(cos_sin_cache, "cos_sin_cache", 2, dtype)
        check_tensor(final_norm, "final_norm", 1, dtype)
        self._keep = (layers, final_norm, cos_sin_cache)
        self.stack = _core.DecoderStack(
            hidden_size=config.hidden_size, num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_size=head_dim, intermediate_size=config.intermediate_size,
            rms_norm_eps=float(config.rms_norm_eps), dtype=CPU_DTYPES[dtype],
            cos_sin_cache=cos_sin_cache.data_ptr(),
            max_positions=cos_sin_cache.shape[0], is_neox=True,
            num_blocks=cache_shape[0], block_size=cache_shape[1],
            batch_invariant=batch_invariant,
            layers=[self._fields(layer, dtype) for layer in layers],
            final_norm=final_norm.data_ptr(),
            moe=[None if layer.moe is None else layer.moe.core for layer in layers])
        self.dtype = dtype
        self.hidden_size = config.hidden_size

    @staticmethod
    def _fields(layer: StackLayer, dtype: torch.dtype) -> list[int]:
        fields = [layer.input_norm.data_ptr(), layer.post_attention_norm.data_ptr()]
        stored_apart: list[int] = []  # after the 20 fields: slot, count, (data, format, rows)*
        for slot, (weight, bias) in enumerate((layer.qkv, layer.o, layer.gate_up, layer.down)):
            if slot >= 2 and layer.moe is not None:
                fields += [0, 0]
            elif isinstance(weight, WeightParts):
                stored_apart += [slot, len(weight.parts)]
                for p in weight.parts:
                    stored_apart += [p.data.data_ptr(), int(WEIGHT_FORMATS[p.format]), p.shape[0]]
                fields += [0, 0]
            elif isinstance(weight, QuantizedWeight):
                fields += [weight.data.data_ptr(), int(WEIGHT_FORMATS[weight.format])]
            else:
                check_tensor(weight, "weight", 2, dtype)
                fields += [weight.data_ptr(), int(WEIGHT_FORMATS[dtype])]
            fields.append(0 if bias is None else bias.data_ptr())
        for cache in (layer.key_cache, layer.value_cache):
            check_tensor(cache, "kv cache", 4, dtype)
            fields.append(cache.data_ptr())
        for norm, name in ((layer.q_norm, "q_norm"), (layer.k_norm, "k_norm")):
            if norm is not None:
                check_tensor(norm, name, 1, dtype)
            fields.append(0 if norm is None else norm.data_ptr())
        fields.append(int(layer.use_rope))
        fields.append(int(layer.sliding_window))
        return fields + stored_apart

    def forward(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                block_tables: torch.Tensor, seq_lens: torch.Tensor,
                query_start_loc: torch.Tensor) -> torch.Tensor:
        """One step: embeddings ``x`` ``[T, H]`` (overwritten: the residual
        stream) -> final hidden states ``[T, H]`` after the last RMSNorm.

        Args:
            positions, slot_mapping: int64 ``[T]``.
            block_tables: int32 ``[B, M]``; seq_lens int32 ``[B]``;
                query_start_loc int32 ``[B + 1]`` (see :mod:`paternoster.kernels`).
        Raises:
            ValueError: naming a bad argument (the core's checks).
        """
        t = check_tensor(x, "x", 2, self.dtype)[0]
        check_tensor(positions, "positions", 1, torch.int64)
        check_tensor(slot_mapping, "slot_mapping", 1, torch.int64)
        b, width = check_tensor(block_tables, "block_tables", 2, torch.int32)
        check_tensor(seq_lens, "seq_lens", 1, torch.int32)
        check_tensor(query_start_loc, "query_start_loc", 1, torch.int32)
        if positions.shape[0] != t or slot_mapping.shape[0] != t:
            raise ValueError(f"positions and slot_mapping need {t} entries (x's rows)")
        if seq_lens.shape[0] != b or query_start_loc.shape[0] != b + 1:
            raise ValueError(f"seq_lens needs {b} and query_start_loc {b + 1} entries")
        out = torch.empty_like(x)
        self.stack._forward_ptr(out.data_ptr(), x.data_ptr(), positions.data_ptr(),
                                slot_mapping.data_ptr(), block_tables.data_ptr(),
                                seq_lens.data_ptr(), query_start_loc.data_ptr(), t, b, width)
        return out
