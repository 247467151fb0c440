"""The kernels of one device behind one interface (vLLM's ``CustomOp``: an op
picks ``forward_cpu``, ``forward_cuda`` or ``forward_native`` once per
platform, and the model never asks which device it is on).

:class:`Backend` holds the device-independent half of the paged-attention ops
(argument checks, the optional index checks, the output allocation) and calls
a subclass's pointer-level launch; its elementwise ops are the torch
reference (:mod:`paternoster.kernels.native`), which a backend with fused
kernels overrides. :class:`NativeBackend` is that reference alone, for devices
without paged-attention kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F

from paternoster.kernels import native
from paternoster.kernels.checks import (
    AttentionSizes,
    CacheWriteSizes,
    check_attention,
    check_attention_indices,
    check_cache_write,
    check_sinks,
    check_slots,
)
from paternoster.kernels.quant import QuantizedWeight, WeightParts


class Backend:
    """The ops of one device type; see :mod:`paternoster.kernels` for the
    layouts and each op's full contract (the module-level functions there
    dispatch to ``backend_for(device)``).

    Attributes:
        dtypes: torch dtypes the paged-attention kernels take -> the kernel's
            dtype value.
        check_indices: check index contents (block ids, lengths, slots)
            before a launch; for kernels whose index tensors are in host
            memory but do not check them themselves (the CUDA emulation).
        batch_invariant_attention: :meth:`paged_attention` takes
            ``batch_invariant=True`` (a row's bits independent of the others).
    """

    dtypes: Mapping[torch.dtype, Any] = MappingProxyType({})
    check_indices: bool = False
    batch_invariant_attention: bool = False

    # ------------------------------------------------------------ paged attention

    def reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                          key_cache: torch.Tensor, value_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
        """Write ``key``/``value`` ``[T, Hkv, D]`` into the cache slots
        ``slot_mapping`` (see :func:`paternoster.kernels.reshape_and_cache`).

        Raises:
            ValueError: naming a bad argument.
        """
        sizes = check_cache_write(key, value, key_cache, value_cache, slot_mapping, self.dtypes)
        if self.check_indices:
            check_slots(slot_mapping, sizes.num_slots)
        self._reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, sizes)

    def paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor,
                        value_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                        out: torch.Tensor | None = None, *, max_query_len: int | None = None,
                        max_seq_len: int | None = None,
                        workspace: torch.Tensor | None = None,
                        batch_invariant: bool = False,
                        sliding_window: int = 0,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of ``query`` ``[T, Hq, D]`` over the paged cache,
        optionally within a sliding window and with attention sinks (see
        :func:`paternoster.kernels.paged_attention`); returns ``out``.

        Raises:
            ValueError: naming a bad argument (a negative ``sliding_window``,
                ``sinks`` not float32 ``[Hq]`` on the query's device among
                them); ``batch_invariant`` on a backend without that mode.
        """
        if batch_invariant and not self.batch_invariant_attention:
            raise ValueError(f"{type(self).__name__} has no batch-invariant attention")
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, Integral):
            raise ValueError(f"sliding_window must be an int, got {sliding_window!r}")
        sliding_window = int(sliding_window)
        if sliding_window < 0:
            raise ValueError(f"sliding_window must be >= 0 (0 = no window), got {sliding_window}")
        sizes = check_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                query_start_loc, out, self.dtypes)
        if sinks is not None:
            check_sinks(sinks, sizes.num_heads, query.device)
        if self.check_indices:
            check_attention_indices(block_tables, seq_lens, query_start_loc, sizes.num_tokens,
                                    sizes.num_blocks, sizes.block_size, max_query_len,
                                    sliding_window)
        if out is None:
            out = torch.empty_like(query)
        self._paged_attention(out, query, key_cache, value_cache, block_tables, seq_lens,
                              query_start_loc, sizes, float(scale), max_query_len, max_seq_len,
                              workspace, batch_invariant, sliding_window, sinks)
        return out

    def alloc_decode_workspace(self, device: torch.device | str, max_num_seqs: int,
                               num_heads: int, num_kv_heads: int, head_size: int,
                               max_seq_len: int) -> torch.Tensor | None:
        """The decode kernel's split-K workspace (see
        :func:`paternoster.kernels.alloc_decode_workspace`).

        Raises:
            ValueError: this backend has no split-K decode kernel (only the
                CUDA backend has one).
        """
        raise ValueError(f"device {device} has no CUDA kernels (no split-K workspace)")

    def _reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                           key_cache: torch.Tensor, value_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, sizes: CacheWriteSizes) -> None:
        raise NotImplementedError

    def _paged_attention(self, out: torch.Tensor, query: torch.Tensor,
                         key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         query_start_loc: torch.Tensor, sizes: AttentionSizes, scale: float,
                         max_query_len: int | None, max_seq_len: int | None,
                         workspace: torch.Tensor | None, batch_invariant: bool = False,
                         sliding_window: int = 0, sinks: torch.Tensor | None = None) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ linear

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight,
               bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
               invariant: bool = False) -> torch.Tensor:
        """``x @ weight.T + bias`` (see :func:`paternoster.kernels.linear`):
        torch's ``F.linear``, a quantized weight dequantized first.

        Raises:
            ValueError: ``invariant`` (no batch-invariant kernels here).
        """
        if invariant:
            raise ValueError(f"batch-invariant linear layers need the CPU kernels; "
                             f"{x.device.type} has none")
        if isinstance(weight, QuantizedWeight | WeightParts):
            weight = weight.dequantize(x.dtype)
        y = F.linear(x, weight, bias)
        return y if out_dtype is None else y.to(out_dtype)

    # ------------------------------------------------------------ elementwise

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of ``x`` ``[T, H]`` (see :func:`paternoster.kernels.rms_norm`);
        returns ``out`` (new if not given)."""
        y = native.rms_norm_torch(x, weight, eps)
        return y if out is None else out.copy_(y)

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor, eps: float) -> None:
        """``residual += x; x = rms_norm(residual)`` in place (see
        :func:`paternoster.kernels.fused_add_rms_norm`)."""
        native.fused_add_rms_norm_torch(x, residual, weight, eps)

    def silu_and_mul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``silu(gate) * up`` of ``x = [gate | up]`` ``[T, 2 I]`` (see
        :func:`paternoster.kernels.silu_and_mul`); returns ``out``."""
        y = native.silu_and_mul_torch(x)
        return y if out is None else out.copy_(y)

    def rotary_embedding(self, positions: torch.Tensor, query: torch.Tensor,
                         key: torch.Tensor, cos_sin_cache: torch.Tensor, head_size: int,
                         is_neox: bool = True) -> None:
        """RoPE in place on ``query`` and ``key`` (see
        :func:`paternoster.kernels.rotary_embedding`)."""
        native.rotary_embedding_torch(positions, query, key, cos_sin_cache, is_neox)


class NativeBackend(Backend):
    """The torch reference alone: the elementwise ops of any device torch
    runs on; no paged-attention kernels (``dtypes`` is empty, so a
    paged-attention call raises ``ValueError`` naming the device).

    Args:
        device_type: the device type it serves (for the error message).
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    def reshape_and_cache(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        """Raises ValueError: no paged-attention kernels on this device type."""
        raise ValueError(self._no_attention())

    def paged_attention(self, query, key_cache, value_cache, block_tables, seq_lens,
                        query_start_loc, scale, out=None, **hints) -> torch.Tensor:
        """Raises ValueError: no paged-attention kernels on this device type."""
        raise ValueError(self._no_attention())

    def _no_attention(self) -> str:
        return (f"paged attention kernels support devices ['cpu', 'cuda'], got "
                f"{self.device_type}")
