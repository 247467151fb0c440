"""The linear layer ``out = x W^T (+ bias)``, dispatched on the input's device
(:func:`~paternoster.kernels.dispatch.backend_for`).

On CPU the C++ core's GEMV/GEMM (``paternoster/linear.h``) takes dense
(float32, bfloat16) and GGUF block-quantized weights
(:class:`~paternoster.kernels.quant.QuantizedWeight`, dequantized in the
kernel one tile at a time), reduces every output element in one fixed order
whatever the batch (so it is batch-invariant) and picks its SIMD variant at
run time. Dense weights on large batches go to torch's GEMM (oneDNN), which is
faster there, unless batch invariance is asked for. Elsewhere: ``F.linear``
(quantized weights dequantized first, by the torch reference).
"""

from __future__ import annotations

import torch

from paternoster.kernels.dispatch import backend_for
from paternoster.kernels.quant import QuantizedWeight, WeightParts

Weight = torch.Tensor | QuantizedWeight | WeightParts


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None, invariant: bool = False) -> torch.Tensor:
    """``x @ weight.T + bias``, rounded once to ``out_dtype``.

    Args:
        x: ``[T, K]``, contiguous; float32 or bfloat16 on CPU.
        weight: ``[N, K]`` tensor of x's dtype, or a quantized weight with
            ``in_features == K``.
        bias: ``[N]`` in x's dtype, or None.
        out_dtype: the result's dtype (default x's); float32 gives unrounded
            float32 sums on CPU whatever the batch (the logits of the LM
            head); elsewhere the model-dtype result converted.
        invariant: every row's result must not depend on the other rows of
            the call (batch-invariant mode): on CPU always the core's kernel,
            and quantized weights never take its 8-bit activation path
            (on AVX2 / AVX-512 CPUs calls of at most 8 rows, or 64 without
            AVX-512 BF16, quantize x per block of 32 as llama.cpp does; see
            ``core/include/paternoster/linear.h``).
    Returns:
        ``[T, N]`` in ``out_dtype``.
    Raises:
        ValueError: naming a bad argument (dtype, shape, contiguity, device),
            or ``invariant`` asked of a device without invariant kernels.
    """
    return backend_for(x.device).linear(x, weight, bias, out_dtype=out_dtype, invariant=invariant)
