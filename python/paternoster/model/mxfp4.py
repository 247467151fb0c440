"""MXFP4 weights (OCP Microscaling Formats (MX) Specification v1.0, 2023):
blocks of 32 FP4 E2M1 elements sharing one E8M0 power-of-two scale, as the
released gpt-oss checkpoints store their expert matrices.

Checkpoint layout (openai/gpt-oss-20b/120b; transformers'
``integrations/mxfp4.py`` reads the same): for a matrix ``W`` of ``[..., R, C]``
(rows = output features) the file holds

- ``*_blocks``: uint8 ``[..., R, C / 32, 16]``, two E2M1 codes per byte, the
  element of even index in the low nibble;
- ``*_scales``: uint8 ``[..., R, C / 32]``, E8M0 exponents: block ``g`` of row
  ``r`` is multiplied by ``2 ** (scales[..., r, g] - 127)``.

We dequantize at load (the kernels have no MXFP4 matmul): every value is a
product of an E2M1 value and a power of two, so float32, bfloat16 and float16
hold it exactly (bar overflow and float16's narrower exponents).
"""

from __future__ import annotations

import torch

#: Elements per shared scale (the spec's block size k).
BLOCK = 32
#: E8M0 code of NaN (the spec's only special value of the scale).
SCALE_NAN = 0xFF
SCALE_BIAS = 127


def e2m1_values() -> torch.Tensor:
    """float32[16], the value of each 4-bit E2M1 code, from the spec's bit
    fields: sign (bit 3), a 2-bit exponent with bias 1 (bits 2-1), a 1-bit
    mantissa (bit 0); exponent 0 is subnormal (``0.5 * m``), else
    ``2 ** (e - 1) * (1 + 0.5 * m)``. No infinities or NaNs."""
    codes = torch.arange(16)
    sign = 1.0 - 2.0 * ((codes >> 3) & 1).float()
    exp = ((codes >> 1) & 3).float()
    man = (codes & 1).float()
    magnitude = torch.where(exp == 0, 0.5 * man, torch.exp2(exp - 1) * (1 + 0.5 * man))
    return sign * magnitude


_E2M1 = e2m1_values()


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """Dense values of an MXFP4 tensor.

    Args:
        blocks: uint8 ``[..., G, 16]``: ``G`` blocks of 32 packed E2M1 codes
            (low nibble first).
        scales: uint8 ``[..., G]``, one E8M0 exponent per block.
        dtype: the result's dtype.
    Returns:
        ``[..., G * 32]`` in ``dtype`` (new tensor, on ``blocks``' device).
    Raises:
        ValueError: not uint8, shapes that do not pair up, or a NaN scale (0xFF).
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} "
                         f"and {scales.dtype}")
    if blocks.shape[-1:] != (BLOCK // 2,) or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales "
                         f"{tuple(scales.shape)} (expected blocks [..., G, {BLOCK // 2}] "
                         f"with scales [..., G])")
    if (scales == SCALE_NAN).any():
        raise ValueError("MXFP4 scales hold 0xFF (NaN in E8M0)")
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # [..., G, 32]
    values = _E2M1.to(blocks.device)[codes.long()]
    exponents = (scales.to(torch.int32) - SCALE_BIAS).unsqueeze(-1)
    return torch.ldexp(values, exponents.float()).to(dtype).flatten(-2)
