"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3 dense) split over
a tensor-parallel group, after Megatron-LM (arXiv:1909.08053, section 3).

Each rank builds the ordinary model class for a *rank-local* config
(:func:`local_config`: ``Hq/n`` query heads, ``Hkv/n`` KV heads,
``I/n`` intermediate features, ``ceil(V/n)`` vocabulary rows) and loads its
shard of every checkpoint tensor into it (:func:`shard_checkpoint`): the
fused q/k/v and gate/up matrices are column-parallel (their rows split),
o_proj and down_proj row-parallel (their columns split). A block then runs
the rank's heads and intermediate features with the usual kernels and closes
each of its two sub-blocks with one all-reduce (after o_proj and after
down_proj): two all-reduces per decoder layer, Megatron's scheme. Row-parallel
biases are held by rank 0 only (zeros elsewhere), so the all-reduce adds them
once. The embedding is vocab-parallel (masked lookup + all-reduce), the LM
head vocab-parallel (all-gather of the logits).

Each rank's KV cache holds its own ``Hkv/n`` heads: ``[num_blocks,
block_size, Hkv/n, D]`` per layer. Block tables and slot mappings are the
same on every rank: rank 0's KV cache manager decides them and every rank
gets the same step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from paternoster.model.attention import AttentionMetadata, AttentionOps
from paternoster.model.llama import LlamaForCausalLM, Qwen2ForCausalLM, Rope
from paternoster.model.llama_weights import layer_name
from paternoster.model.loader import is_gguf, iter_safetensors, model_class
from paternoster.model.parallel.group import TPGroup
from paternoster.model.parallel.layers import ParallelLMHead, VocabParallelEmbedding
from paternoster.model.parallel.shard import (
    check_heads,
    divide,
    shard_cols,
    shard_gate_up,
    shard_qkv,
    shard_rows,
    shard_vocab,
    vocab_range,
)
from paternoster.model.qwen3 import Qwen3ForCausalLM

KVCache = tuple[torch.Tensor, torch.Tensor]

#: The model classes whose blocks this module splits (exact types: subclasses
#: with other blocks, MoE or extra norms, are not covered).
SUPPORTED = (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)

_COLUMN = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias",
           "v_proj.bias", "gate_proj.weight", "up_proj.weight", "gate_proj.bias", "up_proj.bias")
_ROW_BIAS = ("o_proj.bias", "down_proj.bias")


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads)


def _num_kv_heads(hf_config) -> int:
    return getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads


def local_config(hf_config, size: int):
    """A copy of ``hf_config`` with one rank's sizes: ``num_attention_heads``,
    ``num_key_value_heads`` and ``intermediate_size`` divided by ``size``,
    ``vocab_size`` = ``ceil(V/size)``, ``head_dim`` set explicitly.

    Raises:
        ValueError: a head count or ``intermediate_size`` not a multiple of
            ``size`` (the KV heads are split, never replicated).
    """
    heads, kv_heads = hf_config.num_attention_heads, _num_kv_heads(hf_config)
    check_heads(heads, kv_heads, size)
    local = copy.deepcopy(hf_config)
    local.head_dim = _head_dim(hf_config)
    local.num_attention_heads = heads // size
    local.num_key_value_heads = kv_heads // size
    local.intermediate_size = divide(hf_config.intermediate_size, size, "intermediate_size")
    local.vocab_size = vocab_range(hf_config.vocab_size, 0, size)[2]
    return local


def shard_checkpoint(weights: Iterable[tuple[str, torch.Tensor]], hf_config,
                     tp: TPGroup) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors -> the same names with rank ``tp.rank``'s shard
    (what :meth:`LlamaForCausalLM.load_weights` of the :func:`local_config`
    model takes): q/k/v, gate/up rows; o/down columns; embedding and LM head
    vocabulary rows; row-parallel biases on rank 0 (zeros elsewhere); norms whole.

    Raises:
        ValueError: a quantized tensor (not supported under tensor parallel),
            or sizes that do not split (see :mod:`.shard`).
    """
    r, n = tp.rank, tp.size
    heads, kv_heads, d = hf_config.num_attention_heads, _num_kv_heads(hf_config), \
        _head_dim(hf_config)
    for name, w in weights:
        if not isinstance(w, torch.Tensor):
            raise ValueError(f"{name}: quantized weights are not supported with "
                             "tensor parallel")
        found = layer_name(name, 1 << 30)
        leaf = (found[1] if found else name).split(".", 1)[-1]  # e.g. "q_proj.weight"
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            yield name, shard_vocab(w, r, n)
        elif leaf in _COLUMN:
            yield name, shard_rows(w, r, n, name)
        elif leaf in ("qkv_proj.weight", "qkv_proj.bias"):
            yield name, shard_qkv(w, heads, kv_heads, d, r, n)
        elif leaf in ("gate_up_proj.weight", "gate_up_proj.bias"):
            yield name, shard_gate_up(w, r, n)
        elif leaf in ("o_proj.weight", "down_proj.weight"):
            yield name, shard_cols(w, r, n, name)
        elif leaf in _ROW_BIAS:
            yield name, w if r == 0 else torch.zeros_like(w)
        else:
            yield name, w


class TensorParallelCausalLM(nn.Module):
    """One rank's part of a Llama/Qwen2/Qwen3 model split over ``tp``.

    Offers what :class:`~paternoster.model.runner.ModelRunner` calls on a
    model (``forward``, ``compute_logits``, ``set_kv_cache_layout``,
    ``core_only_step``, ``rotary``, ``batch_invariant``). Every rank must
    call ``forward`` and ``compute_logits`` with the same step.

    Args:
        hf_config: the full model's config. dtype: parameter/activation dtype.
        ops: the paged-attention kernels. tp: the group.
        max_positions: RoPE table length (default ``max_position_embeddings``).
    Parameters are allocated uninitialised; call :meth:`load_weights`.
    Raises:
        ValueError: an architecture other than :data:`SUPPORTED`, or sizes
            that do not split over ``tp.size`` (see :func:`local_config`).
    """

    batch_invariant = False

    def __init__(self, hf_config, dtype: torch.dtype, ops: AttentionOps, tp: TPGroup,
                 max_positions: int | None = None) -> None:
        super().__init__()
        cls = model_class(hf_config)
        if cls not in SUPPORTED:
            raise ValueError(f"tensor parallel supports {[c.__name__ for c in SUPPORTED]}, "
                             f"not {cls.__name__}")
        self.config, self.dtype, self.tp = hf_config, dtype, tp
        self.local = cls(local_config(hf_config, tp.size), dtype, ops,
                         max_positions=max_positions)
        self.local.fused_steps = False  # the core's decoder stack has no all-reduce
        self.embed: VocabParallelEmbedding | None = None
        self.lm_head: ParallelLMHead | None = None

    @property
    def rotary(self):
        """The RoPE table (:class:`~paternoster.model.rope.RotaryEmbedding`)."""
        return self.local.rotary

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
        """Load this rank's shard of HF-named full tensors (see
        :func:`shard_checkpoint`); returns the unused names.

        Raises:
            ValueError: what :meth:`LlamaForCausalLM.load_weights` raises
                (missing or mis-shaped tensors), or quantized tensors.
        """
        unused = self.local.load_weights(shard_checkpoint(weights, self.config, self.tp))
        vocab = self.config.vocab_size
        self.embed = VocabParallelEmbedding(self.local.embed_tokens, vocab, self.tp)
        self.lm_head = ParallelLMHead(self.local.lm_head, vocab, self.tp)
        return unused

    def set_kv_cache_layout(self, layout) -> None:
        """Each layer's KV cache group (see :meth:`LlamaForCausalLM.set_kv_cache_layout`)."""
        self.local.set_kv_cache_layout(layout)

    def core_only_step(self, num_tokens: int) -> bool:
        """False: the split model's matmuls run layer by layer in Python
        (the core's decoder stack has no collectives)."""
        return False

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata, kv_caches: list[KVCache]) -> torch.Tensor:
        """The step over this rank's heads, summed over the group.

        Args:
            input_ids: int64[T]; positions: int64[T]; attn: the cache
                placement, the same on every rank.
            kv_caches: per layer this rank's (key_cache, value_cache), each
                ``[num_blocks, block_size, Hkv/n, D]``; updated in place.
        Returns:
            ``[T, H]`` final hidden states, identical on every rank.
        Raises:
            ValueError: called before :meth:`load_weights`.
        """
        if self.embed is None:
            raise ValueError("load_weights must run before forward")
        x = self.embed(input_ids)
        rope, residual = Rope(self.local.rotary, positions), None
        for layer, kv_cache in zip(self.local.layers, kv_caches, strict=True):
            if residual is None:
                residual, h = x, layer.input_layernorm(x)
            else:
                h = layer.input_layernorm.add_forward(x, residual)
            a = self.tp.all_reduce(layer.self_attn(rope, h, kv_cache, attn))
            h = layer.post_attention_layernorm.add_forward(a, residual)
            x = self.tp.all_reduce(layer.mlp(h))
        if residual is None:
            return self.local.norm(x)
        return self.local.norm.add_forward(x, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[N, H]`` -> float32 logits ``[N, V]`` on every rank."""
        return self.lm_head(hidden)


def load_tp_model(model_dir, hf_config, dtype: torch.dtype, ops: AttentionOps, tp: TPGroup,
                  max_positions: int | None = None,
                  device: torch.device | None = None) -> TensorParallelCausalLM:
    """Build this rank's :class:`TensorParallelCausalLM` and load its shard
    of the safetensors checkpoint in ``model_dir`` (each tensor read whole,
    sliced, copied; one at a time).

    Raises:
        ValueError: a GGUF file, an unsupported architecture, sizes that do
            not split, or what the loader raises.
    """
    if is_gguf(model_dir):
        raise ValueError("tensor parallel loads safetensors checkpoints, not GGUF")
    with torch.device(device or "cpu"):
        model = TensorParallelCausalLM(hf_config, dtype, ops, tp, max_positions)
    model.load_weights(iter_safetensors(model_dir))
    return model.eval()
