"""Rotary position embedding (RoPE, Su et al. 2021, "RoFormer") with a cached
cos/sin table indexed by token positions.

Layout is GPT-NeoX's "rotate half" (as in HF Llama/Qwen2 checkpoints): the
first and second halves of each head dimension form the rotated pairs.
Supported frequency schemes: ``default``, ``linear`` (position interpolation,
Chen et al. 2023) and ``llama3`` (Meta's Llama 3.1 wavelength-dependent
scaling, from the Llama 3 paper / reference code).
"""

from __future__ import annotations

import math

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(config, layer_type: str = "full_attention") -> dict:
    """The config's RoPE settings as one dict with ``rope_type`` and ``rope_theta``.

    Reads transformers 5's ``config.rope_parameters`` or, failing that, the 4.x
    pair ``rope_theta`` + ``rope_scaling``. Where transformers 5 keeps one dict
    per layer type (Gemma 3: ``{"full_attention": {...}, "sliding_attention":
    {...}}``), the one of ``layer_type`` is read.

    Raises:
        ValueError: a rope type other than :data:`SUPPORTED_ROPE_TYPES`, or a
            partial rotary factor (not used by the supported architectures).
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    if isinstance(params.get(layer_type), dict):  # per layer type
        params = dict(params[layer_type])
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported")
    params["rope_type"] = rope_type
    return params


def inverse_frequencies(head_dim: int, params: dict) -> torch.Tensor:
    """Per-pair angular frequencies ``theta ** (-2i / D)``, scaled per ``rope_type``.

    Args:
        head_dim: D (even).
        params: from :func:`rope_parameters`.
    Returns:
        float32[D / 2], radians per position.
    """
    base = float(params["rope_theta"])
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponent)
    rope_type = params["rope_type"]
    if rope_type == "linear":
        inv_freq = inv_freq / float(params["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, params)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1 scaling: keep short wavelengths, divide long ones by ``factor``,
    interpolate linearly (in 1/wavelength) between the two thresholds."""
    factor = float(params["factor"])
    low = float(params["low_freq_factor"])
    high = float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = old_len / low  # longer than this: fully scaled
    high_freq_wavelen = old_len / high  # shorter than this: unchanged
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, blended)
    return torch.where(wavelen < high_freq_wavelen, inv_freq, out)


class RotaryEmbedding(nn.Module):
    """Applies RoPE to queries and keys of a flattened batch.

    Args:
        head_dim: D (even).
        max_positions: table length; positions must be in ``[0, max_positions)``.
        params: from :func:`rope_parameters`.
        dtype: dtype of the cached table and of q/k.
    The table is computed in float32 (angle = position * inv_freq, as HF does)
    and then cast to ``dtype``. It is kept once, as ``cos_sin_cache``
    [max_positions, D] (the cos of a position's D/2 angles, then their sin: the
    layout of :func:`paternoster.kernels.rotary_embedding`); ``cos`` and ``sin``
    [max_positions, D/2] are views of its halves.
    """

    def __init__(self, head_dim: int, max_positions: int, params: dict,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        inv_freq = inverse_frequencies(head_dim, params)
        positions = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
        angles = positions[:, None] * inv_freq  # [max_positions, D/2]
        cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)
        self.head_dim = head_dim
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.register_buffer("cos", cache[:, : head_dim // 2], persistent=False)
        self.register_buffer("sin", cache[:, head_dim // 2 :], persistent=False)
