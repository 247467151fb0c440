"""The elementwise ops of a decoder block, dispatched on the input's device
(:func:`~paternoster.kernels.dispatch.backend_for`): one pass over the rows in
the C++ core on CPU (float32 or bfloat16, float32 arithmetic, parallel over
rows for large calls) instead of a chain of small tensor ops and their
float32 copies, whose dispatch costs more than their arithmetic at decode
sizes; the torch reference (:mod:`paternoster.kernels.native`) elsewhere.
Both keep HF Llama's roundings.
"""

from __future__ import annotations

import torch

from paternoster.kernels.dispatch import backend_for


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019) of each row, with HF Llama's roundings.

    ``out = round(round(x * inv_rms) * weight)`` with
    ``inv_rms = 1 / sqrt(mean(x ** 2) + eps)`` in float32 and ``round`` to the
    dtype: the normalised row is cast to the model dtype before the weight is
    applied in that dtype, as HF's ``LlamaRMSNorm`` does, so bfloat16 results
    carry the same bits as torch's (up to the order of the float32 sum).

    Args:
        x: ``[T, H]``, contiguous; float32 or bfloat16 on CPU.
        weight: ``[H]``, same dtype and device.
        eps: added to the mean square (>= 0).
        out: optional ``[T, H]`` output (may be ``x``); new if not given.

    Returns:
        ``out``.

    Raises:
        ValueError: (CPU) naming the argument, for a wrong type, dtype,
            device, shape or a non-contiguous tensor, or a negative ``eps``.
    """
    return backend_for(x.device).rms_norm(x, weight, eps, out)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> None:
    """Residual add and RMSNorm in one pass, in place (vLLM's ``fused_add_rms_norm``):
    ``residual = round(x + residual)``, then ``x = rms_norm(residual, weight, eps)``.

    A pre-norm decoder carries the residual stream through its layers this way:
    the add that closes one sub-block and the norm that opens the next are one
    kernel. The add rounds once, like torch's ``x + residual`` in the dtype,
    and the norm reads the rounded sum, so the bits equal the unfused code's.

    Args:
        x: ``[T, H]``, contiguous; float32 or bfloat16 on CPU. Overwritten
            with the normalised rows.
        residual: ``[T, H]``, same dtype and device, not ``x`` itself.
            Overwritten with ``x + residual``.
        weight: ``[H]``, same dtype and device.
        eps: added to the mean square (>= 0).

    Raises:
        ValueError: (CPU) naming the argument, for a wrong type, dtype,
            device, shape or a non-contiguous tensor, ``residual`` starting
            where ``x`` does, or a negative ``eps``.
    """
    backend_for(x.device).fused_add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU's gating (Shazeer 2020, "GLU Variants Improve Transformer"):
    ``silu(gate) * up`` for ``x = [gate | up]``.

    ``silu(g) = g / (1 + exp(-g))``; on CPU computed in float32 together with
    the product and rounded once. Torch's ``F.silu(gate) * up`` (the
    reference elsewhere) rounds the SiLU output to the dtype first, so in
    bfloat16 an element may differ from it by one unit in the last place
    (relative 2**-8); in float32 by a few ulps.

    Args:
        x: ``[T, 2 * I]``, contiguous: the fused gate/up projection, gate
            columns first; float32 or bfloat16 on CPU.
        out: optional ``[T, I]`` output of ``x``'s dtype (not overlapping ``x``).

    Returns:
        ``out`` (a new ``[T, I]`` tensor if not given).

    Raises:
        ValueError: (CPU) naming the argument, for a wrong type, dtype,
            device, shape (odd width), a non-contiguous tensor or ``out``
            overlapping ``x``.
    """
    return backend_for(x.device).silu_and_mul(x, out)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, head_size: int, is_neox: bool = True) -> None:
    """Rotary position embedding (RoPE, Su et al. 2021, "RoFormer"), in place on
    the queries and keys of a flattened batch; the table lookup is fused in.

    Token t's pair i turns by the angle of row ``positions[t]`` of the table:
    ``x_a' = x_a cos - x_b sin``, ``x_b' = x_b cos + x_a sin``, with pairs
    ``(i, i + D/2)`` when ``is_neox`` (GPT-NeoX / HF Llama "rotate half") and
    ``(2i, 2i + 1)`` otherwise (GPT-J). On CPU both products are rounded to
    the dtype before the sum, as HF's ``q * cos + rotate_half(q) * sin``.

    Args:
        positions: int64 ``[T]``, each in ``[0, max_positions)``.
        query: ``[T, Hq, D]`` or ``[T, Hq * D]``; float32 or bfloat16 on CPU.
            Heads must be contiguous within a row, rows may be further apart
            (a view into a fused qkv projection works, no copy).
        key: ``[T, Hkv, D]`` or ``[T, Hkv * D]``, same dtype and device, the
            same layout rules.
        cos_sin_cache: ``[max_positions, D]``, contiguous, the dtype of
            ``query``: the cos of a position's D/2 angles, then their sin (any
            frequency scaling folded in; see
            :class:`paternoster.model.rope.RotaryEmbedding`).
        head_size: D (even).
        is_neox: the pairing (above).

    Raises:
        ValueError: (CPU) naming the argument, for a wrong type, dtype,
            device or shape, heads not contiguous within a row, an odd
            ``head_size``, or a position outside the table (then nothing is
            written).
        IndexError: (elsewhere) a position outside the table.
    """
    backend_for(query.device).rotary_embedding(positions, query, key, cos_sin_cache, head_size,
                                               is_neox)
