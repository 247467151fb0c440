"""Rotary position embedding (RoPE, Su et al. 2021, "RoFormer") with a cached
cos/sin table indexed by token positions.

Layout is GPT-NeoX's "rotate half" (as in HF Llama/Qwen2 checkpoints): the
first and second halves of each head dimension form the rotated pairs.
Supported frequency schemes: ``default``, ``linear`` (position interpolation,
Chen et al. 2023), ``llama3`` (Meta's Llama 3.1 wavelength-dependent
scaling, from the Llama 3 paper / reference code) and ``yarn`` (Peng et al.
2023, "YaRN: Efficient Context Window Extension of Large Language Models":
NTK-by-parts interpolation plus an attention temperature folded into the
cos/sin table, as HF transformers' ``_compute_yarn_parameters``; gpt-oss).
"""

from __future__ import annotations

import math

import torch
from torch import nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


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
    if rope_type == "yarn":
        params.setdefault("max_position_embeddings",
                          getattr(config, "max_position_embeddings", None))
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
    wavelength_scale = base**exponent
    inv_freq = 1.0 / wavelength_scale
    rope_type = params["rope_type"]
    if rope_type == "linear":
        inv_freq = inv_freq / float(params["factor"])
    elif rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, params)
    elif rope_type == "yarn":
        inv_freq = _yarn_scale(wavelength_scale, head_dim, params)
    return inv_freq


def attention_scaling(params: dict) -> float:
    """The factor the cos/sin table is multiplied by (so q.k by its square):
    1 but for YaRN, whose ``attention_factor`` defaults to the paper's
    ``0.1 ln(s) + 1`` for a ``factor`` s > 1 (or, with DeepSeek's ``mscale``
    and ``mscale_all_dim``, the ratio of two such terms)."""
    if params["rope_type"] != "yarn":
        return 1.0
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = _yarn_factor(params)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if params.get("mscale") and params.get("mscale_all_dim"):
        return mscale(factor, float(params["mscale"])) / mscale(factor,
                                                                float(params["mscale_all_dim"]))
    return mscale(factor)


def _yarn_factor(params: dict) -> float:
    """YaRN's scale s: ``factor``, else the ratio of the extended to the
    original context (``max_position_embeddings`` put in the params by
    :func:`rope_parameters`)."""
    if params.get("factor") is not None:
        return float(params["factor"])
    return float(params["max_position_embeddings"]) / float(
        params["original_max_position_embeddings"])


def _yarn_scale(wavelength_scale: torch.Tensor, head_dim: int, params: dict) -> torch.Tensor:
    """YaRN's NTK-by-parts on ``theta ** (2i / D)`` (float32[D / 2]; the
    inverse frequencies are formed as HF forms them, for its bits): pairs that
    turn more than ``beta_fast`` times over the original context keep their
    frequency, those that turn fewer than ``beta_slow`` times are divided by
    the scale, a linear ramp over the pair index in between (the bounds
    floored/ceiled unless ``truncate`` is False)."""
    factor = _yarn_factor(params)
    base = float(params["rope_theta"])
    old_len = float(params["original_max_position_embeddings"])
    beta_fast = float(params.get("beta_fast") or 32)
    beta_slow = float(params.get("beta_slow") or 1)

    def pair_of(rotations: float) -> float:  # the dimension turning `rotations` times
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (unchanged), 0: interpolate (divided by the factor)
    return 1.0 / (factor * wavelength_scale) * (1 - keep) + 1.0 / wavelength_scale * keep


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
    The table is computed in float32 (angle = position * inv_freq, as HF does),
    multiplied by :func:`attention_scaling` (YaRN) and then cast to ``dtype``.
    It is kept once, as ``cos_sin_cache`` [max_positions, D] (the cos of a
    position's D/2 angles, then their sin: the layout of
    :func:`paternoster.kernels.rotary_embedding`); ``cos`` and ``sin``
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
        cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
        scaling = attention_scaling(params)
        if scaling != 1.0:
            cache = cache * scaling
        cache = cache.to(dtype)
        self.head_dim = head_dim
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.register_buffer("cos", cache[:, : head_dim // 2], persistent=False)
        self.register_buffer("sin", cache[:, head_dim // 2 :], persistent=False)
