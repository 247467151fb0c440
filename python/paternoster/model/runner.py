"""ModelRunner: owns the model and its paged KV cache, runs one forward per step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.attention import AttentionMetadata, AttentionOps, default_attention_ops
from paternoster.model.loader import load_hf_config, load_model, resolve_dtype, sliding_window

_BATCH_DTYPES = {
    "input_ids": np.int64,
    "positions": np.int64,
    "slot_mapping": np.int64,
    "block_tables": np.int32,
    "seq_lens": np.int32,
    "query_start_loc": np.int32,
    "logits_indices": np.int64,
}


class ModelRunner:
    """Loads a model and allocates its KV cache; turns batches into logits.

    Args:
        model_config: model directory, dtype, ``max_model_len``, device.
        cache_config: block size and number of blocks (or memory budget).
        attn_ops: paged-attention kernels; default :mod:`paternoster.ops`.

    Attributes:
        hf_config: the transformers config. model_dir: pathlib.Path.
        dtype: torch dtype of weights, activations and KV cache.
        block_size: tokens per KV block. num_kv_blocks: blocks per layer.
        max_model_len: context cap in tokens = min(requested or
            ``max_position_embeddings``, sliding window if any,
            ``num_kv_blocks * block_size``).
        vocab_size: logits width V.
        eos_token_id: from ``generation_config.json`` if present, else the
            config (first one if a list), or None.
        kv_caches: per layer (key_cache, value_cache), each
            [num_kv_blocks, block_size, Hkv, D], zero-initialised.

    Raises:
        ValueError: unsupported architecture or dtype; a KV cache budget too
            small for one block; ``max_model_len`` above the model's
            ``max_position_embeddings``.
        ImportError: ``attn_ops`` not given and :mod:`paternoster.ops` is not built.
    """

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig, *,
                 attn_ops: AttentionOps | None = None) -> None:
        self.model_dir = Path(model_config.model).expanduser()
        self.hf_config = load_hf_config(self.model_dir)
        cfg = self.hf_config
        self.device = torch.device(model_config.device)
        self.dtype = resolve_dtype(cfg, model_config.dtype, self.device.type)
        self.block_size = cache_config.block_size
        self.num_layers = cfg.num_hidden_layers
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_kv_blocks = self._num_blocks(cache_config)
        self.max_model_len = self._max_model_len(model_config)
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = self._eos_token_id()
        ops = attn_ops if attn_ops is not None else default_attention_ops()
        self.model = load_model(self.model_dir, cfg, self.dtype, ops,
                                max_positions=self.max_model_len).to(self.device)
        self.kv_caches = [
            (self._empty_cache(), self._empty_cache()) for _ in range(self.num_layers)
        ]

    def bytes_per_block(self) -> int:
        """KV cache bytes of one block over all layers, K and V."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def _num_blocks(self, cache_config: CacheConfig) -> int:
        if cache_config.num_kv_blocks is not None:
            return cache_config.num_kv_blocks
        n = cache_config.kv_cache_memory // self.bytes_per_block()
        if n < 1:
            raise ValueError(
                f"kv_cache_memory={cache_config.kv_cache_memory} bytes is less than one block "
                f"({self.bytes_per_block()} bytes)"
            )
        return int(n)

    def _max_model_len(self, model_config: ModelConfig) -> int:
        limit = int(self.hf_config.max_position_embeddings)
        if model_config.max_model_len is not None:
            if model_config.max_model_len > limit:
                raise ValueError(
                    f"max_model_len={model_config.max_model_len} exceeds the model's "
                    f"max_position_embeddings={limit}"
                )
            limit = model_config.max_model_len
        window = sliding_window(self.hf_config)
        if window is not None:
            limit = min(limit, window)  # full attention == sliding window up to W tokens
        return min(limit, self.num_kv_blocks * self.block_size)

    def _eos_token_id(self) -> int | None:
        eos = None
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is None:
            eos = getattr(self.hf_config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return None if eos is None else int(eos)

    def _empty_cache(self) -> torch.Tensor:
        shape = (self.num_kv_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def execute_model(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """One forward pass over a flattened batch; logits for selected tokens.

        Args:
            batch: numpy arrays (converted zero-copy when already of the right
                dtype): ``input_ids`` int64[T], ``positions`` int64[T],
                ``slot_mapping`` int64[T], ``block_tables`` int32[B, M],
                ``seq_lens`` int32[B], ``query_start_loc`` int32[B + 1],
                ``logits_indices`` int64[N] (token rows whose logits to return,
                usually each sequence's last scheduled token).
        Returns:
            float32 [N, V] logits.
        Raises:
            KeyError: a batch array is missing.
        """
        t = {name: _tensor(batch[name], dt) for name, dt in _BATCH_DTYPES.items()}
        if self.device.type != "cpu":
            t = {name: x.to(self.device, non_blocking=True) for name, x in t.items()}
        attn = AttentionMetadata(
            slot_mapping=t["slot_mapping"],
            block_tables=t["block_tables"],
            seq_lens=t["seq_lens"],
            query_start_loc=t["query_start_loc"],
        )
        hidden = self.model(t["input_ids"], t["positions"], attn, self.kv_caches)
        return self.model.compute_logits(hidden[t["logits_indices"]])


def _tensor(array: np.ndarray, dtype: type) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype))
