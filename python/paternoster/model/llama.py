"""Llama-family decoder (Llama 2/3, SmolLM2, Mistral with its sliding window)
and Qwen2 (the same with q/k/v biases), written for a flattened, unpadded
batch and a paged KV cache.

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

import torch
import torch.nn.functional as F
from torch import nn

from paternoster import kernels
from paternoster.kernels import QuantizedWeight, WeightParts
from paternoster.model.attention import AttentionMetadata, AttentionOps, paged_attention_layer
from paternoster.model.kv_layout import KVCacheLayout, kv_cache_layout, layer_windows
from paternoster.model.llama_weights import LlamaWeights, Weight, quant_method
from paternoster.model.moe import SparseMoeBlock
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
    Weights are dense parameters or, once loaded so, quantized
    (:class:`~paternoster.kernels.QuantizedWeight`); ``invariant`` asks the
    linear kernels for batch-invariant results; ``use_rope`` False skips RoPE
    (SmolLM3's NoPE layers).
    """

    use_rope = True
    #: Attention window in tokens, 0 for full attention (set per layer from
    #: the config by the model; :func:`paternoster.model.kv_layout.layer_windows`).
    sliding_window = 0
    #: The layer's KV cache group (set by the runner: set_kv_cache_layout).
    kv_group = 0

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False) -> None:
        super().__init__()
        self.invariant = invariant
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
        qkv = kernels.linear(x, self.qkv_weight, self.qkv_bias, invariant=self.invariant)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotate(rope, *self.norm_qk(q.view(T, self.num_heads, self.head_dim),
                                               k.view(T, self.num_kv_heads, self.head_dim)))
        v = v.reshape(T, self.num_kv_heads, self.head_dim)
        out = self.attend(q, k, v, kv_cache, attn)
        return kernels.linear(out.view(T, self.q_size), self.o_weight, self.o_bias,
                              invariant=self.invariant)

    def matrices(self) -> tuple[Weight, Weight]:
        """The block's projection matrices (dense or quantized)."""
        return self.qkv_weight, self.o_weight

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
               attn: AttentionMetadata) -> torch.Tensor:
        """The paged-attention step (q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``
        after RoPE -> ``[T, Hq, D]``): causal, within ``sliding_window`` when
        set, through the layer's KV cache group."""
        return paged_attention_layer(self.ops, q, k, v, kv_cache, attn, self.scale,
                                     sliding_window=self.sliding_window, kv_group=self.kv_group)

    def norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head normalization of q ``[T, Hq, D]`` and k ``[T, Hkv, D]``
        before RoPE: none in Llama (Qwen3 overrides)."""
        return q, k

    def rotate(self, rope: Rope, q: torch.Tensor,
               k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE on q ``[T, Hq, D]`` and k ``[T, Hkv, D]`` (in place where
        they are views), unless ``use_rope`` is off; returns them (Ministral 3
        also scales q)."""
        return rope(q, k) if self.use_rope else (q, k)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020): ``down(silu(gate(x)) * up(x))`` with
    gate and up fused into ``gate_up_weight`` [2 I, H] (gate rows first)."""

    def __init__(self, config, dtype: torch.dtype, invariant: bool = False) -> None:
        super().__init__()
        self.invariant = invariant
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
        gate_up = kernels.linear(x, self.gate_up_weight, self.gate_up_bias,
                                 invariant=self.invariant)
        return kernels.linear(kernels.silu_and_mul(gate_up), self.down_weight, self.down_bias,
                              invariant=self.invariant)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + mlp(norm(h))``."""

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps, qkv_bias: bool,
                 o_bias: bool, invariant: bool = False,
                 attention_cls: type[LlamaAttention] = LlamaAttention,
                 mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.self_attn = attention_cls(config, dtype, ops, qkv_bias, o_bias, invariant)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        # The feed-forward block: [T, H] -> [T, H] (a SwiGLU MLP unless given).
        self.mlp = mlp if mlp is not None else LlamaMLP(config, dtype, invariant)

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
        a = self.mix(rope, h, kv_cache, attn)
        return self.mlp(self.post_attention_layernorm.add_forward(a, residual)), residual

    def mix(self, rope: Rope, h: torch.Tensor, cache, attn: AttentionMetadata) -> torch.Tensor:
        """The token mixer on the normed stream ``h`` ``[T, H]`` -> ``[T, H]``:
        the attention (LFM2's conv layers override)."""
        return self.self_attn(rope, h, cache, attn)


class LlamaForCausalLM(LlamaWeights, nn.Module):
    """Causal LM over a flattened batch with a paged KV cache.

    Args:
        config: a transformers ``LlamaConfig``/``MistralConfig``/``Qwen2Config``
            (only its fields are read).
        dtype: parameter and activation dtype (float32 or bfloat16 on CPU).
        ops: the paged-attention kernels (:class:`AttentionOps`).
        max_positions: RoPE table length; defaults to ``max_position_embeddings``.
        batch_invariant: every sequence's logits bit-identical whatever else
            runs in its step (the linear layers on the core's fixed-order
            kernels; the CPU attention and elementwise kernels are per row).
    Parameters are allocated uninitialised; call :meth:`load_weights`.
    Raises:
        ValueError: unsupported activation or rope type, or a
            ``quantization_config`` whose method is not in :attr:`quant_methods`.
    """

    qkv_bias = False  # Qwen2 overrides
    attention_cls: type[LlamaAttention] = LlamaAttention  # Qwen3 overrides
    norm_cls: type[nn.Module] = RMSNorm  # the final norm (Gemma 3 overrides)
    #: The model stores q/k in the order of a partial rotation
    #: (:func:`~paternoster.model.rope.partial_rotation_order`; Phi-3 does).
    partial_rotation = False
    #: Run CPU steps whose matrix multiplies all take the core's kernels (see
    #: ``_decoder_stack``) as one call into the core's decoder stack: the
    #: same kernels in the same order, without the Python per-kernel cost.
    fused_steps = True
    #: The torch ops between the core's kernels in a core-only CPU step are
    #: elementwise (norms, adds, activations), cheap on one thread: the runner
    #: turns torch's own threads off for such steps (model/torch_threads.py).
    torch_ops_elementwise = True
    #: ``quantization_config.quant_method`` values whose weights the class reads.
    quant_methods: tuple[str, ...] = ()

    def __init__(self, config, dtype: torch.dtype, ops: AttentionOps,
                 max_positions: int | None = None, batch_invariant: bool = False) -> None:
        quant = quant_method(config)
        if quant is not None and quant not in self.quant_methods:
            raise ValueError(f"quantization_config.quant_method {quant!r} is not supported for "
                             f"{type(self).__name__} (its scales are not read): serve the "
                             f"bfloat16 checkpoint or a GGUF file")
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.batch_invariant = batch_invariant
        attention_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = self.qkv_bias or attention_bias
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        self.rotary = RotaryEmbedding(
            head_dim, max_positions or config.max_position_embeddings,
            rope_parameters(config, partial_rotation=self.partial_rotation), dtype,
        )
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            self.make_layer(config, dtype, ops, i, qkv_bias, attention_bias, batch_invariant)
            for i in range(config.num_hidden_layers)
        )
        self.norm = self.norm_cls(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = self.embed_tokens  # replaced by load_weights if untied
        for layer, window in zip(self.layers, layer_windows(config), strict=True):
            token_mixer(layer).sliding_window = window
        self.kv_cache_layout = kv_cache_layout(config)

    def set_kv_cache_layout(self, layout: KVCacheLayout) -> None:
        """Give each layer its KV cache group (whose slot mapping and block
        tables it reads from the step's metadata).

        Raises:
            ValueError: the layout is for another number of layers.
        """
        if len(layout.layer_groups) != len(self.layers):
            raise ValueError(f"KV cache layout for {len(layout.layer_groups)} layers, "
                             f"the model has {len(self.layers)}")
        for layer, group in zip(self.layers, layout.layer_groups, strict=True):
            token_mixer(layer).kv_group = group
        self.kv_cache_layout = layout

    def make_layer(self, config, dtype: torch.dtype, ops: AttentionOps, index: int,
                   qkv_bias: bool, o_bias: bool, invariant: bool) -> nn.Module:
        """Decoder layer ``index``: the pre-norm Llama block with
        :attr:`attention_cls` and :meth:`make_mlp`'s feed-forward block
        (Gemma 3 overrides with its own block)."""
        return LlamaDecoderLayer(config, dtype, ops, qkv_bias, o_bias, invariant,
                                 self.attention_cls, self.make_mlp(config, dtype, index, invariant))

    def make_mlp(self, config, dtype: torch.dtype, index: int, invariant: bool) -> nn.Module:
        """Layer ``index``'s feed-forward block: the dense SwiGLU MLP (MoE
        models override)."""
        return LlamaMLP(config, dtype, invariant)

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
        x = embed(input_ids, self.embed_tokens, self.dtype)
        stack = self._decoder_stack(input_ids.shape[0], kv_caches)
        if stack is not None:
            return stack.forward(x, positions, attn.slot_mapping, attn.block_tables,
                                 attn.seq_lens, attn.query_start_loc)
        rope = Rope(self.rotary, positions)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(rope, x, residual, kv_cache, attn)
        if residual is None:  # no layers
            return self.norm(x)
        return self.norm.add_forward(x, residual)

    def _decoder_stack(self, num_tokens: int, kv_caches: list[KVCache]):
        """The core's decoder stack for this step, or None to run the layers
        here. Used on CPU with the default kernels when every matrix multiply
        of the step takes the core's kernel in the Python path too (at most
        ``kernels.cpu.DENSE_CORE_MAX_TOKENS`` tokens, batch-invariant mode, or every
        layer's weights quantized) and every layer has the dense MLP, so both
        paths give the same bits; built once per KV cache."""
        if not self.fused_steps or self.norm.weight.device.type != "cpu" or not self.layers:
            return None
        if self.layers[0].self_attn.ops is not kernels or self.dtype not in (torch.float32,
                                                                          torch.bfloat16):
            return None
        if not self.core_only_step(num_tokens) or not self._stack_mlps():
            return None
        if self.kv_cache_layout.num_groups > 1:  # the stack reads one block table
            return None
        key = (kv_caches[0][0].data_ptr(), len(kv_caches))
        if getattr(self, "_stack_key", None) != key:
            layers = [_stack_layer(layer, cache)
                      for layer, cache in zip(self.layers, kv_caches, strict=True)]
            self._stack = kernels.CpuDecoderStack(self.config, self.dtype, layers,
                                                  self.norm.weight, self.rotary.cos_sin_cache,
                                                  self.batch_invariant)
            self._stack_key = key
        return self._stack

    def core_only_step(self, num_tokens: int) -> bool:
        """Whether every matrix multiply of a CPU step of ``num_tokens`` tokens
        runs on the core's kernels: few enough tokens for the dense GEMV path
        (:func:`paternoster.kernels.core_runs_matmuls`), batch-invariant mode,
        or every layer's weights quantized."""
        return (kernels.core_runs_matmuls(num_tokens) or self.batch_invariant
                or self._all_quantized())

    def _stack_mlps(self) -> bool:
        """Every layer's feed-forward block is one the core's decoder stack
        has: the SwiGLU MLP, or routed experts that run as one core call
        (:meth:`SparseMoeBlock.core_experts`; its token-count condition is
        :meth:`core_only_step`'s, checked by the caller). Decided once."""
        if getattr(self, "_stack_mlp_layers", None) is None:
            self._stack_mlp_layers = all(isinstance(mlp, LlamaMLP) or (
                isinstance(mlp, SparseMoeBlock) and mlp.core_experts(1) is not None)
                for mlp in (layer.mlp for layer in self.layers))
        return self._stack_mlp_layers

    def _all_quantized(self) -> bool:
        if getattr(self, "_quantized_layers", None) is None:
            self._quantized_layers = all(
                isinstance(w, QuantizedWeight | WeightParts) for layer in self.layers
                for w in (*token_mixer(layer).matrices(), layer.mlp.gate_up_weight,
                          layer.mlp.down_weight))
        return self._quantized_layers

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] (model dtype) -> float32 logits [N, V]: on CPU the
        float32 sums unrounded at any batch size (:func:`paternoster.kernels.linear`),
        so a near-tie between two tokens does not flip with the batch's shape
        (a bfloat16 LM head rounds logits to 8 bits; measured cost in
        docs/benchmarks.md, "CPU decode"); on CUDA the model-dtype result."""
        return kernels.linear(hidden, self.lm_head, out_dtype=torch.float32,
                              invariant=self.batch_invariant)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 (Qwen Team 2024): Llama with biases on the q/k/v projections."""

    qkv_bias = True


def token_mixer(layer: nn.Module) -> nn.Module:
    """A decoder layer's token mixer: its ``self_attn``, or the ``mixer`` of
    a layer without attention (LFM2's short-conv layers)."""
    attn = getattr(layer, "self_attn", None)
    return attn if attn is not None else layer.mixer


def embed(input_ids: torch.Tensor, table: Weight, dtype: torch.dtype) -> torch.Tensor:
    """Embedding lookup: rows ``input_ids`` of ``table`` ``[V, H]`` in ``dtype``;
    a quantized table has just those rows dequantized."""
    if isinstance(table, QuantizedWeight):
        rows = QuantizedWeight(table.data[input_ids], table.format, table.in_features)
        return rows.dequantize(dtype)
    return F.embedding(input_ids, table)


def _stack_layer(layer: LlamaDecoderLayer, cache: KVCache) -> kernels.StackLayer:
    attn, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # Qwen3
    moe = mlp.core_experts(1) if isinstance(mlp, SparseMoeBlock) else None
    return kernels.StackLayer(moe=moe,
        input_norm=layer.input_layernorm.weight,
        post_attention_norm=layer.post_attention_layernorm.weight,
        qkv=(attn.qkv_weight, attn.qkv_bias), o=(attn.o_weight, attn.o_bias),
        gate_up=(mlp.gate_up_weight, mlp.gate_up_bias), down=(mlp.down_weight, mlp.down_bias),
        key_cache=cache[0], value_cache=cache[1],
        q_norm=None if q_norm is None else q_norm.weight,
        k_norm=None if k_norm is None else k_norm.weight, use_rope=attn.use_rope,
        sliding_window=attn.sliding_window)
