"""Rotary position embedding (RoPE, Su et al. 2021, "RoFormer") with a cached
cos/sin table indexed by token positions.

Layout is GPT-NeoX's "rotate half" (as in HF Llama/Qwen2 checkpoints): the
first and second halves of each head dimension form the rotated pairs.
Supported frequency schemes: ``default``, ``linear`` (position interpolation,
Chen et al. 2023), ``llama3`` (Meta's Llama 3.1 wavelength-dependent
scaling, from the Llama 3 paper / reference code), ``yarn`` (Peng et al.
2023, "YaRN: Efficient Context Window Extension of Large Language Models":
NTK-by-parts interpolation plus an attention temperature folded into the
cos/sin table, as HF transformers' ``_compute_yarn_parameters``; gpt-oss) and
``longrope`` (Ding et al. 2024, arXiv 2402.13753: per-pair rescale factors,
a short and a long set; :mod:`paternoster.model.longrope`, which also says
how the set is chosen for a paged KV cache; Phi-3 128k, Phi-3.5, Phi-4-mini).

Partial rotation (``partial_rotary_factor`` < 1, Phi-4-mini: HF rotates the
first R = int(D * factor) dimensions of each head, pairs ``(i, i + R/2)``,
and passes the rest through) is kept in the same D-column table, for the
same kernels: its columns past R/2 are the identity (cos 1, sin 0), and the
model stores q and k with their head dimensions in the order of
:func:`partial_rotation_order`, which puts HF's pair ``(i, i + R/2)`` at
``(i, i + D/2)``. A common permutation of q's and k's dimensions leaves
q.k unchanged, and the identity pairs come out bit-exact.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from paternoster.model.longrope import longrope_attention_factor, longrope_inverse_frequencies

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(config, layer_type: str = "full_attention",
                    partial_rotation: bool = False) -> dict:
    """The config's RoPE settings as one dict with ``rope_type``, ``rope_theta``
    and ``partial_rotary_factor``.

    Reads transformers 5's ``config.rope_parameters`` or, failing that, the 4.x
    pair ``rope_theta`` + ``rope_scaling`` (and a top-level
    ``partial_rotary_factor``). Where transformers 5 keeps one dict per layer
    type (Gemma 3: ``{"full_attention": {...}, "sliding_attention": {...}}``),
    the one of ``layer_type`` is read. For ``yarn`` and ``longrope`` the
    config's ``max_position_embeddings`` is added; for ``longrope`` also
    ``original_max_position_embeddings``, the config's top-level field first
    (as transformers' ``standardize_rope_params``: Phi-3 keeps it there),
    else the dict's, else ``max_position_embeddings``.

    Args:
        partial_rotation: the model lays q/k out for a partial rotation
            (:func:`partial_rotation_order`; Phi-3); otherwise a factor < 1
            is refused.
    Raises:
        ValueError: a rope type other than :data:`SUPPORTED_ROPE_TYPES`, or a
            partial rotary factor other than 1 without ``partial_rotation``.
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
    if params.get("partial_rotary_factor") is None:
        params["partial_rotary_factor"] = getattr(config, "partial_rotary_factor", None) or 1.0
    if float(params["partial_rotary_factor"]) != 1.0 and not partial_rotation:
        raise ValueError("partial_rotary_factor != 1 is not supported for this architecture")
    params["rope_type"] = rope_type
    factors = getattr(config, "rope_freq_factors", None)
    if factors is not None:  # a GGUF file's rope_freqs tensor (Llama 3.1+)
        params["freq_factors"] = list(factors)
    if rope_type in ("yarn", "longrope"):
        params.setdefault("max_position_embeddings",
                          getattr(config, "max_position_embeddings", None))
    if rope_type == "longrope":
        top = getattr(config, "original_max_position_embeddings", None)
        if top is not None:
            params["original_max_position_embeddings"] = top
        params.setdefault("original_max_position_embeddings", params["max_position_embeddings"])
    return params


def rotary_dim(head_dim: int, params: dict) -> int:
    """R, the dimensions of a head that RoPE turns: ``int(D *
    partial_rotary_factor)`` (HF's rounding), D without the factor.

    Raises:
        ValueError: R not even, or not in ``(0, D]``.
    """
    rot = int(head_dim * float(params.get("partial_rotary_factor") or 1.0))
    if rot <= 0 or rot > head_dim or rot % 2:
        raise ValueError(f"partial_rotary_factor {params.get('partial_rotary_factor')} of "
                         f"head_dim {head_dim} gives {rot} rotated dimensions; they must be "
                         "even and in (0, head_dim]")
    return rot


def partial_rotation_order(head_dim: int, rot: int) -> torch.Tensor:
    """Where the table of a partial rotation wants HF's head dimensions:
    int64[D], entry j the HF dimension stored at j. HF pairs ``(i, i + R/2)``
    (i < R/2, rotated) land at ``(i, i + D/2)``; the D - R passed-through
    dimensions fill columns ``[R/2, D/2)`` and ``[D/2 + R/2, D)`` in order.
    The identity for ``rot == head_dim``.

    Args:
        head_dim: D. rot: R from :func:`rotary_dim` (even, <= D).
    """
    half, keep = rot // 2, (head_dim - rot) // 2
    ar = torch.arange
    return torch.cat([ar(half), rot + ar(keep), half + ar(half), rot + keep + ar(keep)])


def inverse_frequencies(head_dim: int, params: dict,
                        max_positions: int | None = None) -> torch.Tensor:
    """Per-pair angular frequencies ``theta ** (-2i / D)``, scaled per ``rope_type``.

    Args:
        head_dim: D (even): the rotated dimensions (R of :func:`rotary_dim`
            under a partial rotation).
        params: from :func:`rope_parameters`.
        max_positions: the table length, which picks LongRoPE's short or
            long factors (:func:`paternoster.model.longrope.uses_long_factors`;
            None: short); other types ignore it.
    Returns:
        float32[D / 2], radians per position.
    Raises:
        ValueError: LongRoPE factors that do not fit (see
            :func:`paternoster.model.longrope.rescale_factors`), or
            ``freq_factors`` of another length than D / 2.
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
    elif rope_type == "longrope":
        inv_freq = longrope_inverse_frequencies(wavelength_scale, params, max_positions)
    if params.get("freq_factors") is not None:
        factors = torch.tensor(params["freq_factors"], dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope_freq_factors has {factors.numel()} values, the rotation "
                             f"{inv_freq.numel()} frequencies")
        inv_freq = inv_freq / factors
    return inv_freq


def attention_scaling(params: dict) -> float:
    """The factor the cos/sin table is multiplied by (so q.k by its square):
    1 but for YaRN, whose ``attention_factor`` defaults to the paper's
    ``0.1 ln(s) + 1`` for a ``factor`` s > 1 (or, with DeepSeek's ``mscale``
    and ``mscale_all_dim``, the ratio of two such terms), and LongRoPE
    (:func:`paternoster.model.longrope.longrope_attention_factor`)."""
    if params["rope_type"] == "longrope":
        return longrope_attention_factor(params)
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
            It also picks LongRoPE's short or long factors
            (:mod:`paternoster.model.longrope`).
        params: from :func:`rope_parameters`.
        dtype: dtype of the cached table and of q/k.
    The table is computed in float32 (angle = position * inv_freq, as HF does),
    multiplied by :func:`attention_scaling` (YaRN, LongRoPE) and then cast to
    ``dtype``. It is kept once, as ``cos_sin_cache`` [max_positions, D] (the
    cos of a position's D/2 angles, then their sin: the layout of
    :func:`paternoster.kernels.rotary_embedding`); ``cos`` and ``sin``
    [max_positions, D/2] are views of its halves. Under a partial rotation
    (``rotary_dim`` R < D) only the first R/2 angles turn; the other columns
    hold cos 1 and sin 0 (see the module docstring for the q/k layout this
    needs).

    Raises:
        ValueError: an odd ``head_dim``, or what :func:`rotary_dim` and
            :func:`inverse_frequencies` raise.
    """

    def __init__(self, head_dim: int, max_positions: int, params: dict,
                 dtype: torch.dtype) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        rot = rotary_dim(head_dim, params)
        inv_freq = inverse_frequencies(rot, params, max_positions)
        positions = torch.arange(max_positions, dtype=torch.int64).to(torch.float32)
        angles = positions[:, None] * inv_freq  # [max_positions, R/2]
        cos, sin = angles.cos(), angles.sin()
        scaling = attention_scaling(params)
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        if rot < head_dim:  # identity pairs past the rotated ones
            keep = (max_positions, (head_dim - rot) // 2)
            cos = torch.cat([cos, torch.ones(keep)], dim=-1)
            sin = torch.cat([sin, torch.zeros(keep)], dim=-1)
        cache = torch.cat([cos, sin], dim=-1).to(dtype)
        self.head_dim = head_dim
        #: R: the dimensions turned (:func:`rotary_dim`).
        self.rotary_dim = rot
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.register_buffer("cos", cache[:, : head_dim // 2], persistent=False)
        self.register_buffer("sin", cache[:, head_dim // 2 :], persistent=False)
