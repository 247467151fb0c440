"""The C++ core's kernels (``paternoster._core``) as the CPU backend: paged
attention with the online softmax of FlashAttention (Dao et al. 2022), so
memory does not grow with the context, and the fused elementwise ops of the
decoder block (RMSNorm, residual add + RMSNorm, SiLU-and-mul, RoPE) in one
pass over the rows, float32 arithmetic, float32 or bfloat16 tensors.

The kernels take raw pointers; every call is checked here first
(:mod:`paternoster.kernels.checks`). The core checks index contents itself
(block ids, lengths, slots), so this backend leaves ``check_indices`` off.
Work is spread over :func:`set_num_threads` threads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from paternoster import _core
from paternoster.kernels.backend import Backend
from paternoster.kernels.checks import (
    AttentionSizes,
    CacheWriteSizes,
    check_heads,
    check_rows,
    check_tensor,
    check_weight,
    kernel_dtype,
)
from paternoster.kernels.quant import QUANT_FORMATS, QuantizedWeight, WeightParts

CPU_DTYPES = {torch.float32: _core.DType.float32, torch.bfloat16: _core.DType.bfloat16}

WEIGHT_FORMATS = {**{f: getattr(_core.WeightFormat, f) for f in QUANT_FORMATS},
                  torch.float32: _core.WeightFormat.float32,
                  torch.bfloat16: _core.WeightFormat.bfloat16}


@functools.cache
def torch_gemm_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later), which
    torch's bfloat16 GEMM (oneDNN) then uses: it multiplies many rows several
    times faster than AVX-512, which moves the core kernel's crossover
    (:data:`DENSE_CORE_MAX_TOKENS`). Asked of torch (``torch.cpu``); ``False``
    where this torch cannot tell. Asked once per process."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe is not None and probe())


def dense_core_max_tokens(linear_isa: str, amx: bool) -> int:
    """Rows up to which a dense linear layer runs on the core's kernel, from
    where the core kernel and torch's GEMM cross over with bfloat16 weights
    (``bench/decode_ab.py --compare threshold``, docs/benchmarks.md, "CPU
    decode" and "The core kernel against AMX"):

    - ``avx512bf16`` without AMX (the 2-core EPYC): 128. Decode steps on the
      core are 1.2-1.5x faster at 12 to 96 rows and ~1.05x at 128 (bfloat16
      dot products, weights prefetched, six rows per micro-kernel).
    - ``avx512bf16`` with AMX (the 2-core Xeon): 24. The core is 1.2-1.4x
      faster at 12-16 rows, even at 24, and oneDNN's AMX GEMM 1.2-1.6x faster
      from 32 to 128 rows.
    - otherwise (the core multiplies in float32; not re-measured since): 8.

    Args:
        linear_isa: the core's linear kernel variant (``_core.linear_isa()``).
        amx: :func:`torch_gemm_has_amx`.
    """
    if linear_isa != "avx512bf16":
        return 8
    return 24 if amx else 128


#: Above this many rows a dense (unquantized) linear layer runs on torch's GEMM
#: (oneDNN) unless batch invariance is asked for; up to it, on the core's
#: kernel, and a step of that many tokens through the core's decoder stack
#: (no Python per kernel call). Longer prefill chunks keep oneDNN's blocked
#: GEMM. Chosen per CPU at import (:func:`dense_core_max_tokens`).
DENSE_CORE_MAX_TOKENS = dense_core_max_tokens(_core.linear_isa(), torch_gemm_has_amx())


#: The values ``$PATERNOSTER_CPU_ISA`` may name (the attention kernel's
#: variants, best first; the linear kernel follows the attention one, upgraded
#: to ``avx512bf16`` where the CPU has AVX-512 BF16).
CPU_ISA_NAMES = ("avx512", "avx2", "baseline")


def describe_linear_split(batch_invariant: bool) -> str:
    """Which kernel takes a step's unquantized linear layers, for the start-up
    log: ``"unquantized linear layers: steps of up to 24 tokens on
    Paternoster's kernel, longer ones on torch's GEMM (oneDNN, with AMX for
    bfloat16)"``; in batch-invariant mode every step stays on Paternoster's
    kernel. Quantized weights are not covered by this rule."""
    if batch_invariant:
        return "linear layers: every step on Paternoster's kernel (batch-invariant mode)"
    amx = ", with AMX for bfloat16" if torch_gemm_has_amx() else ""
    return (f"unquantized linear layers: steps of up to {DENSE_CORE_MAX_TOKENS} tokens on "
            f"Paternoster's kernel, longer ones on torch's GEMM (oneDNN{amx})")


def simd_variants(environ: Mapping[str, str] = os.environ) -> tuple[str, str | None]:
    """The core's SIMD variants in use, for the start-up log.

    Returns:
        ``("attention avx512, linear avx512bf16", None)``, or with a warning
        as the second item when ``PATERNOSTER_CPU_ISA`` (read by the core once)
        named a variant that is unknown or that this CPU/build cannot run, and
        so was not applied.
    """
    attention, linear = _core.attention_isa(), _core.linear_isa()
    text = f"attention {attention}, linear {linear}"
    want = environ.get("PATERNOSTER_CPU_ISA")
    if not want or want == attention:  # unset or empty: the best variant
        return text, None
    why = ("is not a variant" if want not in CPU_ISA_NAMES
           else "is not available on this CPU or in this build")
    return text, (f"PATERNOSTER_CPU_ISA={want!r} {why} (one of {', '.join(CPU_ISA_NAMES)}); "
                  f"ignored, using {text}")


def core_runs_matmuls(num_tokens: int) -> bool:
    """Whether dense linear layers of ``num_tokens`` rows run on the core's
    kernel (rather than torch's GEMM) on CPU: at most
    :data:`DENSE_CORE_MAX_TOKENS` rows (read at call time)."""
    return num_tokens <= DENSE_CORE_MAX_TOKENS


set_num_threads = _core.set_num_threads
get_num_threads = _core.get_num_threads
set_spin_micros = _core.set_spin_micros
get_spin_micros = _core.get_spin_micros


class CpuBackend(Backend):
    """The C++ core's kernels for CPU tensors (float32, bfloat16). The CUDA
    keyword arguments of :meth:`paged_attention` (``max_query_len``,
    ``max_seq_len``, ``workspace``) are accepted and ignored."""

    dtypes = CPU_DTYPES
    batch_invariant_attention = True

    def _reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                           key_cache: torch.Tensor, value_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, sizes: CacheWriteSizes) -> None:
        _core._reshape_and_cache_ptr(key.data_ptr(), value.data_ptr(), key_cache.data_ptr(),
                                     value_cache.data_ptr(), slot_mapping.data_ptr(), *sizes,
                                     CPU_DTYPES[key.dtype])

    def _paged_attention(self, out: torch.Tensor, query: torch.Tensor,
                         key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         query_start_loc: torch.Tensor, sizes: AttentionSizes, scale: float,
                         max_query_len: int | None, max_seq_len: int | None,
                         workspace: torch.Tensor | None, batch_invariant: bool = False,
                         sliding_window: int = 0, sinks: torch.Tensor | None = None) -> None:
        _core._paged_attention_ptr(out.data_ptr(), query.data_ptr(), key_cache.data_ptr(),
                                   value_cache.data_ptr(), block_tables.data_ptr(),
                                   seq_lens.data_ptr(), query_start_loc.data_ptr(), *sizes,
                                   scale, CPU_DTYPES[query.dtype], batch_invariant,
                                   sliding_window, 0 if sinks is None else sinks.data_ptr())

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """The core's RMSNorm (see :func:`paternoster.kernels.rms_norm`).

        Raises:
            ValueError: naming a bad argument, or a negative ``eps``.
        """
        t, h = check_rows(x, "x", CPU_DTYPES)
        check_weight(weight, x, h)
        if out is None:
            out = torch.empty_like(x)
        elif check_tensor(out, "out", 2, x.dtype, x.device) != x.shape:
            raise ValueError(f"out shape {tuple(out.shape)} != x shape {tuple(x.shape)}")
        _core._rms_norm_ptr(out.data_ptr(), x.data_ptr(), weight.data_ptr(), t, h, float(eps),
                            CPU_DTYPES[x.dtype])
        return out

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor, eps: float) -> None:
        """The core's residual add + RMSNorm (see
        :func:`paternoster.kernels.fused_add_rms_norm`).

        Raises:
            ValueError: naming a bad argument, ``residual`` aliasing ``x``, or
                a negative ``eps``.
        """
        t, h = check_rows(x, "x", CPU_DTYPES)
        if check_tensor(residual, "residual", 2, x.dtype, x.device) != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape "
                             f"{tuple(x.shape)}")
        check_weight(weight, x, h)
        _core._fused_add_rms_norm_ptr(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), t,
                                      h, float(eps), CPU_DTYPES[x.dtype])

    def silu_and_mul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The core's SiLU-and-mul (see :func:`paternoster.kernels.silu_and_mul`).

        Raises:
            ValueError: naming a bad argument (odd width, ``out`` overlapping ``x``).
        """
        t, w = check_rows(x, "x", CPU_DTYPES)
        if w % 2:
            raise ValueError(f"x must have an even number of columns (gate, up), got {w}")
        inter = w // 2
        if out is None:
            out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
        elif tuple(check_tensor(out, "out", 2, x.dtype, x.device)) != (t, inter):
            raise ValueError(f"out must have shape {(t, inter)}, got {tuple(out.shape)}")
        _core._silu_and_mul_ptr(out.data_ptr(), x.data_ptr(), t, inter, CPU_DTYPES[x.dtype])
        return out

    def rotary_embedding(self, positions: torch.Tensor, query: torch.Tensor,
                         key: torch.Tensor, cos_sin_cache: torch.Tensor, head_size: int,
                         is_neox: bool = True) -> None:
        """The core's RoPE with the table lookup fused in (see
        :func:`paternoster.kernels.rotary_embedding`).

        Raises:
            ValueError: naming a bad argument, or a position outside the table
                (then nothing is written).
        """
        if head_size <= 0 or head_size % 2:
            raise ValueError(f"head_size must be even and > 0, got {head_size}")
        t, hq, q_stride = check_heads(query, "query", head_size, None, None)
        dtype = kernel_dtype(CPU_DTYPES, query, "query")
        t_k, hkv, k_stride = check_heads(key, "key", head_size, query.dtype, query.device)
        if t_k != t:
            raise ValueError(f"key has {t_k} tokens, query has {t}")
        if check_tensor(positions, "positions", 1, torch.int64, query.device)[0] != t:
            raise ValueError(f"positions has {positions.shape[0]} entries, query has {t} "
                             "tokens")
        max_pos, d = check_tensor(cos_sin_cache, "cos_sin_cache", 2, query.dtype, query.device)
        if d != head_size:
            raise ValueError(f"cos_sin_cache has {d} columns, expected head_size={head_size}")
        _core._rotary_embedding_ptr(positions.data_ptr(), query.data_ptr(), key.data_ptr(),
                                    cos_sin_cache.data_ptr(), t, hq, hkv, head_size, q_stride,
                                    k_stride, max_pos, bool(is_neox), dtype)

    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight | WeightParts,
               bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
               invariant: bool = False) -> torch.Tensor:
        """The core's GEMV/GEMM (see :func:`paternoster.kernels.linear`); dense
        weights above :data:`DENSE_CORE_MAX_TOKENS` rows go to torch's GEMM
        unless ``invariant`` or a float32 result of bfloat16 inputs is asked
        (torch would round it to bfloat16 first).

        Raises:
            ValueError: naming a bad argument (dtype, shape, device, contiguity).
        """
        t, k = check_rows(x, "x", CPU_DTYPES)
        out_dtype = x.dtype if out_dtype is None else out_dtype
        if out_dtype not in CPU_DTYPES:
            raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
        parts = None
        if isinstance(weight, QuantizedWeight | WeightParts):
            if weight.device != x.device:
                raise ValueError(f"weight is on {weight.device}, expected {x.device}")
            n, wk = weight.shape
            if isinstance(weight, WeightParts):
                parts = [(p.data.data_ptr(), WEIGHT_FORMATS[p.format], p.shape[0])
                         for p in weight.parts]
            else:
                fmt, data = WEIGHT_FORMATS[weight.format], weight.data
        else:
            n, wk = check_tensor(weight, "weight", 2, x.dtype, x.device)
            # torch's bfloat16 GEMM rounds its output: a float32 result of
            # bfloat16 inputs (the logits) always comes from the core.
            if not invariant and t > DENSE_CORE_MAX_TOKENS and out_dtype == x.dtype:
                y = F.linear(x, weight, bias)
                return y if y.dtype == out_dtype else y.to(out_dtype)
            fmt, data = WEIGHT_FORMATS[x.dtype], weight
        if wk != k:
            raise ValueError(f"weight has {wk} input features, x has {k}")
        if bias is not None and tuple(check_tensor(bias, "bias", 1, x.dtype, x.device)) != (n,):
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
        out = torch.empty((t, n), dtype=out_dtype)
        if parts is not None:
            _core._linear_parts_ptr(out.data_ptr(), CPU_DTYPES[out_dtype], x.data_ptr(),
                                    CPU_DTYPES[x.dtype], parts,
                                    0 if bias is None else bias.data_ptr(), t, k,
                                    batch_invariant=invariant)
            return out
        _core._linear_ptr(out.data_ptr(), CPU_DTYPES[out_dtype], x.data_ptr(), CPU_DTYPES[x.dtype],
                          data.data_ptr(), fmt, 0 if bias is None else bias.data_ptr(), t, n, k,
                          batch_invariant=invariant)
        return out
