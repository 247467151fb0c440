"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral without sliding window) and
Qwen2 (the same with q/k/v biases), written for a flattened, unpadded batch and
a paged KV cache.

Architecture after Touvron et al. 2023 ("Llama 2"): pre-norm RMSNorm blocks of
grouped-query attention with RoPE and a SwiGLU MLP. The q/k/v projections are
fused into one matrix, as are gate/up, so each block runs four matmuls;
:meth:`LlamaForCausalLM.load_weights` maps HF checkpoint names onto the fused
parameters.

Every layer has one forward path. The elementwise work between the matmuls
runs in :mod:`paternoster.kernels`, which picks the implementation for the
tensors' device (the C++ core's fused kernels on CPU, the torch reference on
CUDA): RMSNorm, the residual add fused with the next RMSNorm (the residual
stream is carried through the layers as in vLLM), SiLU-and-mul and in-place
RoPE with the table lookup folded in. Both keep HF Llama's roundings: RMSNorm
and the residual adds give HF's bits (up to the order of a float32 sum), RoPE
gives HF's bits on CPU (the torch reference fuses one product into an
addcmul, so it can differ by one unit in the last place), and the CPU
SiLU-and-mul rounds once where torch rounds twice (see
:func:`paternoster.kernels.silu_and_mul`). The paged-attention kernels are an
object passed in (:class:`~paternoster.model.attention.AttentionOps`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.model.attention import AttentionMetadata, AttentionOps, paged_attention_layer
from paternoster.model.rope import RotaryEmbedding, rope_parameters

KVCache = tuple[torch.Tensor, torch.Tensor]


def _param(*shape: int, dtype: torch.dtype, device: torch.device | None = None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Rope:
    """RoPE for one step's tokens, shared by all layers: rotates q and k in
    place through the model's cos/sin table
    (:func:`paternoster.kernels.rotary_embedding`).

    Args:
        rotary: the model's table.
        positions: int64[T], each token's position.
    """

    def __init__(self, rotary: RotaryEmbedding, positions: torch.Tensor) -> None:
        self.rotary = rotary
        self.positions = positions

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] (views into the qkv projection are fine)
        -> the same tensors, rotated in place.

        Raises:
            ValueError: (CPU) a position outside the table.
            IndexError: (elsewhere) a position outside the table.
        """
        kernels.rotary_embedding(self.positions, q, k, self.rotary.cos_sin_cache,
                                 self.rotary.head_dim)
        return q, k


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32
    and cast back before the weight is applied (as HF Llama does).

    Args:
        size: hidden size H. eps: added to the mean square.
    """

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = _param(size, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> new [T, H], same dtype (:func:`paternoster.kernels.rms_norm`)."""
        return kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` and ``x = norm(residual)``, both in place
        (:func:`paternoster.kernels.fused_add_rms_norm`); returns x."""
        kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)
        return x


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with fused q/k/v projection and RoPE.

    ``qkv_proj.weight`` is [(Hq + 2 Hkv) * D, H]: rows of q, then k, then v.
    """

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.ops = ops
        self.qkv_weight = _param(self.q_size + 2 * self.kv_size, hidden, dtype=dtype)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size, dtype=dtype) if qkv_bias else None
        self.o_weight = _param(hidden, self.q_size, dtype=dtype)
        self.o_bias = _param(hidden, dtype=dtype) if o_bias else None

    def forward(self, rope: Rope, x: torch.Tensor, kv_cache: KVCache,
                attn: AttentionMetadata) -> torch.Tensor:
        """x: [T, H] -> [T, H]; writes this step's K/V into ``kv_cache``."""
        T = x.shape[0]
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = rope(q.view(T, self.num_heads, self.head_dim),
                    k.view(T, self.num_kv_heads, self.head_dim))
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        out = paged_attention_layer(self.ops, q, k, v, kv_cache, attn, self.scale)
        return F.linear(out.view(T, self.q_size), self.o_weight, self.o_bias)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))`` with
    gate and up fused into ``gate_up_weight`` [2 I, H] (gate rows first)."""

    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {config.hidden_act!r}")
        hidden, inter = config.hidden_size, config.intermediate_size
        bias = bool(getattr(config, "mlp_bias", False))
        self.inter = inter
        self.gate_up_weight = _param(2 * inter, hidden, dtype=dtype)
        self.gate_up_bias = _param(2 * inter, dtype=dtype) if bias else None
        self.down_weight = _param(hidden, inter, dtype=dtype)
        self.down_bias = _param(hidden, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        gate_up = F.linear(x, self.gate_up_weight, self.gate_up_bias)
        return F.linear(kernels.silu_and_mul(gate_up), self.down_weight, self.down_bias)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = LlamaAttention(config, dtype, ops, qkv_bias, o_bias)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.mlp = LlamaMLP(config, dtype)

    def forward(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: KVCache, attn: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """The block with the residual stream carried separately (as vLLM
        does): the add closing each sub-block runs in one pass with the norm
        opening the next (:meth:`RMSNorm.add_forward`).

        Args:
            x: [T, H], the previous block's MLP output, not yet added to
                ``residual`` (overwritten); the embeddings when ``residual`` is None.
            residual: [T, H], the stream before ``x`` is added (updated in
                place), or None for the first layer.
            kv_cache: this layer's (key_cache, value_cache); this step's K/V
                are written into it.
        Returns:
            (mlp output [T, H], residual): ``mlp_out + residual`` is the
            block's output ``h + mlp(norm(h))`` with ``h = x + attn(norm(x))``.
        """
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h = self.input_layernorm.add_forward(x, residual)
        a = self.self_attn(rope, h, kv_cache, attn)
        return self.mlp(self.post_attention_layernorm.add_forward(a, residual)), residual


class LlamaForCausalLM(nn.Module):
    """Causal LM over a flattened batch with a paged KV cache.

    Args:
        config: a transformers ``LlamaConfig``/``MistralConfig``/``Qwen2Config``
            (only its fields are read).
        dtype: parameter and activation dtype (float32 or bfloat16 on CPU).
        ops: the paged-attention kernels (:class:`AttentionOps`).
        max_positions: RoPE table length; defaults to ``max_position_embeddings``.
    Parameters are allocated uninitialised; call :meth:`load_weights`.
    Raises:
        ValueError: unsupported activation or rope type.
    """

    qkv_bias = False  # Qwen2 overrides

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        attention_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = self.qkv_bias or attention_bias
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        self.rotary = RotaryEmbedding(
            head_dim, max_positions or config.max_position_embeddings,
            rope_parameters(config), dtype,
        )
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, dtype, ops, qkv_bias, attention_bias)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens  # replaced by load_weights if untied

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        """Run all layers over the step's tokens.

        Args:
            input_ids: int64[T], the tokens of all scheduled sequences, back to back.
            positions: int64[T], each token's position in its sequence, in
                ``[0, max_positions)`` (the RoPE table; beyond it IndexError, or
                ValueError from the CPU kernels).
            attn: cache placement (see :class:`AttentionMetadata`).
            kv_caches: per layer (key_cache, value_cache), each
                [num_blocks, block_size, Hkv, D] in the model dtype; updated in place.
        Returns:
            [T, H] final hidden states (after the last RMSNorm), model dtype.
        """
        x = F.embedding(input_ids, self.embed_tokens)
        rope = Rope(self.rotary, positions)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, attn)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm.add_forward(x, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (model dtype) -> float32 logits [N, V] (matmul in model dtype)."""
        return F.linear(hidden, self.lm_head).float()

    # ------------------------------------------------------------------ weights

    def _targets(self, name: str) -> tuple[torch.Tensor, int, int] | None:
        """Map an HF tensor name to (parameter, first row, row count) or None."""
        if name == "model.embed_tokens.weight":
            return self.embed_tokens, 0, self.embed_tokens.shape[0]
        if name == "model.norm.weight":
            return self.norm.weight, 0, self.norm.weight.shape[0]
        if not name.startswith("model.layers."):
            return None
        index, _, rest = name[len("model.layers."):].partition(".")
        if not index.isdigit() or int(index) >= len(self.layers):
            return None
        layer = self.layers[int(index)]
        attn, mlp = layer.self_attn, layer.mlp
        q, kv = attn.q_size, attn.kv_size
        table = {
            "self_attn.q_proj.weight": (attn.qkv_weight, 0, q),
            "self_attn.k_proj.weight": (attn.qkv_weight, q, kv),
            "self_attn.v_proj.weight": (attn.qkv_weight, q + kv, kv),
            "self_attn.q_proj.bias": (attn.qkv_bias, 0, q),
            "self_attn.k_proj.bias": (attn.qkv_bias, q, kv),
            "self_attn.v_proj.bias": (attn.qkv_bias, q + kv, kv),
            "self_attn.o_proj.weight": (attn.o_weight, 0, attn.o_weight.shape[0]),
            "self_attn.o_proj.bias": (attn.o_bias, 0, None),
            "mlp.gate_proj.weight": (mlp.gate_up_weight, 0, mlp.inter),
            "mlp.up_proj.weight": (mlp.gate_up_weight, mlp.inter, mlp.inter),
            "mlp.gate_proj.bias": (mlp.gate_up_bias, 0, mlp.inter),
            "mlp.up_proj.bias": (mlp.gate_up_bias, mlp.inter, mlp.inter),
            "mlp.down_proj.weight": (mlp.down_weight, 0, mlp.down_weight.shape[0]),
            "mlp.down_proj.bias": (mlp.down_bias, 0, None),
            "input_layernorm.weight": (layer.input_layernorm.weight, 0, None),
            "post_attention_layernorm.weight": (layer.post_attention_layernorm.weight, 0, None),
        }
        target = table.get(rest)
        if target is None or target[0] is None:
            return None
        param, start, rows = target
        return param, start, param.shape[0] if rows is None else rows

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Copy HF-named tensors into the (fused) parameters, casting to the model dtype.

        Args:
            weights: (name, tensor) pairs as in an HF ``LlamaForCausalLM``/
                ``Qwen2ForCausalLM`` state dict.
        Returns:
            Names that were not used (e.g. ``rotary_emb.inv_freq``).
        Raises:
            ValueError: a tensor has the wrong shape, or a parameter row range
                was never written (missing weight). ``lm_head.weight`` is
                optional: without it (or with ``tie_word_embeddings``) the LM
                head is the embedding matrix.
        """
        tied = bool(getattr(self.config, "tie_word_embeddings", False))
        loaded: set[tuple[int, int]] = set()
        unused: list[str] = []
        lm_head: torch.Tensor | None = None
        for name, tensor in weights:
            if name == "lm_head.weight":
                if not tied:
                    lm_head = _param(*self.embed_tokens.shape, dtype=self.dtype,
                                     device=self.embed_tokens.device)
                    _copy_rows(name, lm_head, 0, lm_head.shape[0], tensor)
                continue
            target = self._targets(name)
            if target is None:
                unused.append(name)
                continue
            param, start, rows = target
            _copy_rows(name, param, start, rows, tensor)
            loaded.add((id(param), start))
        if lm_head is not None:
            self.lm_head = lm_head
        missing = self._missing(loaded)
        if missing:
            raise ValueError(f"checkpoint is missing weights: {missing[:8]}"
                             + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
        return unused

    def _missing(self, loaded: set[tuple[int, int]]) -> list[str]:
        missing = []
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        for i, layer in enumerate(self.layers):
            for rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                         "input_layernorm.weight", "post_attention_layernorm.weight"):
                names.append(f"model.layers.{i}.{rest}")
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv_bias is not None:
                names += [f"model.layers.{i}.self_attn.{p}_proj.bias" for p in "qkv"]
            if attn.o_bias is not None:
                names.append(f"model.layers.{i}.self_attn.o_proj.bias")
            if mlp.gate_up_bias is not None:
                names += [f"model.layers.{i}.mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
        for name in names:
            param, start, _ = self._targets(name)
            if (id(param), start) not in loaded:
                missing.append(name)
        return missing


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 (Qwen Team 2024): Llama with biases on the q/k/v projections."""

    qkv_bias = True


def _copy_rows(name: str, param: torch.Tensor, start: int, rows: int,
               tensor: torch.Tensor) -> None:
    expected = (rows, *param.shape[1:])
    if tuple(tensor.shape) != expected:
        raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {expected}")
    param.data[start : start + rows].copy_(tensor)
