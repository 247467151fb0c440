"""The kernels: one dispatch per op and device (C++ core on CPU, CUDA on GPUs,
the torch reference elsewhere), below the model and above ``_core`` /
``_cuda_ops``. Nothing here imports :mod:`paternoster.model`.

The functions below run on ``backend_for(tensor.device)``
(:mod:`paternoster.kernels.dispatch`, the one place that picks an
implementation). A caller that wants other kernels for the same tensors (the
CUDA emulation on CPU tensors, :func:`emulated_cuda_backend`; a fake in a test)
holds a :class:`Backend` object and calls its methods, which have the same
signatures: nothing global is swapped.

Modules: ``checks`` (argument validation), ``native`` (torch reference),
``backend`` (the interface), ``cpu`` / ``cuda`` / ``emulation`` (the
backends), ``dispatch``, ``attention``, ``elementwise`` and ``linear`` (the ops),
``quant`` (GGUF block-quantized weights).

Layouts (all contiguous, same floating dtype):

- ``query``, ``out``: ``[T, Hq, D]`` (T tokens of the step, flattened over
  sequences; Hq query heads; head size D)
- ``key``, ``value``: ``[T, Hkv, D]``
- ``key_cache``, ``value_cache``: ``[num_blocks, block_size, Hkv, D]``
- ``block_tables``: int32 ``[B, max_blocks_per_seq]``
- ``seq_lens``: int32 ``[B]``, tokens of context per sequence including this
  step's tokens
- ``query_start_loc``: int32 ``[B + 1]``, sequence b owns query rows
  ``query_start_loc[b]:query_start_loc[b + 1]``
- ``slot_mapping``: int64 ``[T]``, slot = block id * block_size + offset;
  negative = skip the token

Dtypes: float32 or bfloat16 on CPU; float16 or bfloat16 on CUDA (the CUDA
kernels have no float32 path: serving on a GPU runs in 16-bit).
"""

from __future__ import annotations

from paternoster.kernels.attention import (
    alloc_decode_workspace,
    paged_attention,
    reshape_and_cache,
)
from paternoster.kernels.backend import Backend, NativeBackend
from paternoster.kernels.cpu import (
    CpuBackend,
    core_runs_matmuls,
    get_num_threads,
    get_spin_micros,
    set_num_threads,
    set_spin_micros,
)
from paternoster.kernels.cuda import CudaBackend
from paternoster.kernels.decoder import CpuDecoderStack, StackLayer
from paternoster.kernels.dispatch import backend_for, cuda_kernels_available
from paternoster.kernels.elementwise import (
    fused_add_rms_norm,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from paternoster.kernels.emulation import cuda_emulation_available, emulated_cuda_backend
from paternoster.kernels.linear import linear
from paternoster.kernels.moe import CpuMoeExperts, moe_route
from paternoster.kernels.quant import QUANT_FORMATS, QuantizedWeight, WeightParts
from paternoster.kernels.ssm import mamba2_state_update, short_conv_update

__all__ = [
    "Backend",
    "CpuBackend",
    "CpuDecoderStack",
    "CpuMoeExperts",
    "CudaBackend",
    "NativeBackend",
    "QUANT_FORMATS",
    "QuantizedWeight",
    "StackLayer",
    "WeightParts",
    "alloc_decode_workspace",
    "core_runs_matmuls",
    "backend_for",
    "cuda_emulation_available",
    "cuda_kernels_available",
    "emulated_cuda_backend",
    "fused_add_rms_norm",
    "get_num_threads",
    "get_spin_micros",
    "linear",
    "moe_route",
    "paged_attention",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "set_num_threads",
    "set_spin_micros",
    "silu_and_mul",
    "mamba2_state_update",
    "short_conv_update",
]
