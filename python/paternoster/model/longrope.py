"""LongRoPE frequency scaling (Ding et al. 2024, "LongRoPE: Extending LLM
Context Window Beyond 2 Million Tokens", arXiv 2402.13753), as Phi-3's 128k
checkpoints, Phi-3.5-mini and Phi-4-mini use it (``rope_type`` "longrope",
formerly "su"; HF transformers' ``_compute_longrope_parameters``).

Each rotated pair i of a head gets its own rescale factor ``lambda_i``: the
inverse frequency is ``1 / (lambda_i * theta ** (2i / R))`` (R the rotated
dimensions). The checkpoint carries two sets, ``short_factor`` for sequences
within ``original_max_position_embeddings`` (L) and ``long_factor`` beyond,
and the cos/sin table is multiplied by ``attention_factor``, by default
``sqrt(1 + ln(s) / ln(L))`` with ``s = max_position_embeddings / L`` (1 when
s <= 1), for both sets.

Short or long in a paged KV cache. HF transformers picks the set per forward
call: long when the call's largest position is >= L, short otherwise, for
every position of the call; and its ``generate`` drops the KV cache and
recomputes the whole sequence with the long set at the step a sequence
first grows past L. Here a key is rotated once, when it is written into the
paged cache, and the cache's blocks are shared by prefix and split across
chunked-prefill steps, so a per-step switch would leave a request with keys
of both sets (or need that recompute). The engine therefore picks one set
for the whole model from the length of its RoPE table, ``max_positions``
(the runner's ``max_model_len``; on CUDA the context cap before the KV cache
is sized): **long if max_positions > L, short otherwise** (what vLLM's
``Phi3LongRoPEScaledRotaryEmbedding`` does from its ``max_model_len``
today). Nothing changes when a request crosses L mid-decode; its earlier
keys already have the set its later ones get. Against HF:

- ``max_model_len <= L``: every request is within L; all logits are HF's
  (short factors).
- ``max_model_len > L``: a request longer than L gets HF's logits at every
  step past L (HF's forward over the sequence, and HF ``generate`` after its
  recompute). Steps at lengths <= L (all of a request that stays within L,
  the first ones of a request that crosses L mid-decode) are computed with
  the long set where HF uses the short one: a deviation
  (tests/model/test_phi3_longrope.py checks that those logits are HF's with
  the long set forced, and differ from HF's default). To get HF's short-context results,
  serve with ``--max-model-len`` L (4096 for the Phi checkpoints).
"""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger(__name__)


def uses_long_factors(params: dict, max_positions: int | None) -> bool:
    """Whether a table of ``max_positions`` rows takes ``long_factor`` (see
    the module docstring): ``max_positions > original_max_position_embeddings``;
    False for ``max_positions`` None (HF's ``seq_len`` None)."""
    return max_positions is not None and max_positions > int(
        params["original_max_position_embeddings"])


def rescale_factors(params: dict, rotary_dim: int, max_positions: int | None) -> torch.Tensor:
    """The per-pair factors ``lambda`` of the chosen set, float32[R / 2].

    Args:
        params: from :func:`paternoster.model.rope.rope_parameters` (with
            ``short_factor``, ``long_factor``, ``original_max_position_embeddings``).
        rotary_dim: R, the rotated dimensions of a head.
        max_positions: the table length (:func:`uses_long_factors`).
    Raises:
        ValueError: a factor list missing, not R / 2 positive numbers.
    """
    name = "long_factor" if uses_long_factors(params, max_positions) else "short_factor"
    logger.info("LongRoPE: %s for every request (RoPE table of %s positions, original "
                "context %s; --max-model-len at or below it selects the short factors)",
                name, max_positions, params["original_max_position_embeddings"])
    factors = params.get(name)
    if not isinstance(factors, (list, tuple)) or len(factors) != rotary_dim // 2:
        raise ValueError(f"longrope {name} must be a list of {rotary_dim // 2} numbers "
                         f"(half the rotated head dimensions), got {factors!r:.80}")
    out = torch.tensor([float(f) for f in factors], dtype=torch.float32)
    if not bool((out > 0).all()):
        raise ValueError(f"longrope {name} must be positive")
    return out


def longrope_inverse_frequencies(wavelength_scale: torch.Tensor, params: dict,
                                 max_positions: int | None) -> torch.Tensor:
    """``1 / (lambda_i * theta ** (2i / R))``, float32[R / 2]: the paper's
    non-uniform per-dimension rescaling (arXiv 2402.13753, the searched
    factors ``lambda_i`` stretching pair i's wavelength), as HF's
    ``_compute_longrope_parameters``. From ``wavelength_scale`` =
    ``theta ** (2i / R)`` float32[R / 2] (formed as HF forms it, for its
    bits); ``lambda`` from :func:`rescale_factors`.

    Raises:
        ValueError: see :func:`rescale_factors`.
    """
    rotary_dim = 2 * wavelength_scale.shape[0]
    return 1.0 / (rescale_factors(params, rotary_dim, max_positions) * wavelength_scale)


def longrope_attention_factor(params: dict) -> float:
    """The cos/sin multiplier (a float; q.k is scaled by its square):
    ``attention_factor`` if given, else ``sqrt(1 + ln(s) / ln(L))`` for the
    scale s (``factor``, else ``max_position_embeddings / L``) > 1, else 1
    (as HF's ``_compute_longrope_parameters`` and Phi-3's reference code;
    L = ``original_max_position_embeddings``)."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    old_len = float(params["original_max_position_embeddings"])
    factor = params.get("factor")
    if factor is None:
        factor = float(params["max_position_embeddings"]) / old_len
    factor = float(factor)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(old_len))
