"""The torch reference of the elementwise ops (vLLM's ``forward_native``): what
runs where no fused kernel exists (CUDA, other devices), written with HF
Llama's roundings so a model gives HF's numbers on every device.

No argument checks here: the tensors come from a model whose shapes are right
by construction (the C++ core's wrappers check, because a pointer kernel would
misread a wrong tensor; torch raises on its own).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) as HF Llama: float32 statistics, the
    normalised rows cast to ``x``'s dtype, then multiplied by ``weight`` in
    that dtype.

    Args:
        x: ``[T, H]``. weight: ``[H]``, ``x``'s dtype. eps: added to the mean square.
    Returns:
        a new ``[T, H]`` tensor of ``x``'s dtype.
    """
    x32 = x.float()  # a copy unless x is float32
    inv_rms = torch.rsqrt(x32.square().mean(-1, keepdim=True).add_(eps))
    y = x32.mul_(inv_rms) if x.dtype != torch.float32 else x32 * inv_rms
    return y.to(x.dtype).mul_(weight)


def fused_add_rms_norm_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                             eps: float) -> None:
    """``residual += x`` (rounded once, in the dtype), then
    ``x = rms_norm_torch(residual)``; both in place.

    Args:
        x, residual: ``[T, H]``, same dtype, distinct tensors. weight: ``[H]``.
    """
    residual.add_(x)
    x.copy_(rms_norm_torch(residual, weight, eps))


def silu_and_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gating (Shazeer 2020): ``silu(gate) * up`` for
    ``gate_up = [gate | up]`` ``[T, 2 I]``; the SiLU output is rounded to the
    dtype before the product (as torch's ``F.silu(gate) * up``).

    Returns:
        a new ``[T, I]`` tensor.
    """
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[:, :inter]).mul_(gate_up[:, inter:])


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, H, D]`` (any strides, e.g. a view into the fused qkv
    output) by the angles whose ``cos``/``sin`` are ``[T, 1, D/2]``, pairing
    ``(i, i + D/2)`` (GPT-NeoX / HF Llama "rotate half").

    Returns:
        a new contiguous ``[T, H, D]``: first half ``x1 cos - x2 sin``, second
        half ``x2 cos + x1 sin`` (four fused ops instead of HF's
        rotate-half-and-concatenate; the addcmul may differ from HF's two
        roundings by one unit in the last place).
    """
    x1, x2 = x.chunk(2, dim=-1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out.chunk(2, dim=-1)
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
    return out


def rotary_embedding_torch(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                           cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """RoPE (Su et al. 2021) in place on ``query`` ``[T, Hq, D]`` / ``[T, Hq * D]``
    and ``key`` by the angles of ``cos_sin_cache[positions]``
    (``[max_positions, D]``, cos then sin): :func:`apply_rotary` when
    ``is_neox``, the same arithmetic on interleaved (GPT-J) pairs otherwise.

    Raises:
        IndexError: a position outside the table (torch's indexing).
    """
    d = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2] each
    for x in (query, key):
        heads = x.view(x.shape[0], -1, d)
        if is_neox:
            heads.copy_(apply_rotary(heads, cos, sin))
            continue
        x1, x2 = heads[..., 0::2], heads[..., 1::2]
        o1 = torch.mul(x1, cos).addcmul_(x2, sin, value=-1)
        o2 = torch.mul(x2, cos).addcmul_(x1, sin)
        x1.copy_(o1)
        x2.copy_(o2)
