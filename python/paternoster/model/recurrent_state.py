"""The tensors of one state slot of one recurrent layer, by the kind of
token mixer a config's ``layer_types`` names (the layers of the
recurrent-state group, :mod:`paternoster.model.kv_layout`): the runner
allocates them for every slot and takes their bytes out of the KV cache
budget before it counts blocks.

- ``"linear_attention"`` in a config with ``linear_*`` fields: Gated
  DeltaNet (Qwen3-Next, Qwen3.5): the conv state ``[C, K - 1]`` (model
  dtype) and the delta-rule state ``[Hv, Dk, Dv]`` (float32);
- ``"linear_attention"`` in a config with Mamba fields: Mamba2 (Nemotron-H,
  Granite 4.0-H): the conv state ``[C, K - 1]`` (model dtype) and the SSM
  state ``[H, P, N]`` (float32);
- ``"conv"``: LFM2's gated short convolution: the conv state ``[H, K - 1]``
  (model dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from paternoster.model import gated_deltanet, mamba2, short_conv
from paternoster.model.kv_layout import RECURRENT_LAYER_TYPES


@dataclass(frozen=True)
class StateTensor:
    """One state tensor of a slot: its shape, and whether it is kept in
    float32 (else in the model dtype)."""

    shape: tuple[int, ...]
    float32: bool = False

    def dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The tensor's dtype for a model of ``model_dtype``."""
        return torch.float32 if self.float32 else model_dtype


def recurrent_kind(config) -> str | None:
    """The recurrent token mixer ``config.layer_types`` names (one of
    :data:`~paternoster.model.kv_layout.RECURRENT_LAYER_TYPES`), or None.

    Raises:
        ValueError: two recurrent kinds in one model.
    """
    kinds = {t for t in getattr(config, "layer_types", None) or () if t in RECURRENT_LAYER_TYPES}
    if len(kinds) > 1:
        raise ValueError(f"layer_types mixes recurrent layer kinds {sorted(kinds)}")
    return kinds.pop() if kinds else None


def slot_tensors(config) -> tuple[StateTensor, ...]:
    """One slot of one recurrent layer of ``config``'s model; () without
    recurrent layers."""
    kind = recurrent_kind(config)
    if kind == "linear_attention":
        mamba = not hasattr(config, "linear_conv_kernel_dim")
        conv, ssm = (mamba2 if mamba else gated_deltanet).state_shapes(config)
        return StateTensor(conv), StateTensor(ssm, float32=True)
    if kind == "conv":
        return (StateTensor(short_conv.state_shape(config)),)
    return ()


def slot_bytes(config, dtype: torch.dtype) -> int:
    """Bytes of one slot of one recurrent layer in a model of ``dtype``."""
    return sum(math.prod(t.shape) * t.dtype(dtype).itemsize for t in slot_tensors(config))


def empty_states(config, num_slots: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
    """One recurrent layer's state tensors over ``num_slots`` slots, zeroed:
    each ``[num_slots, *shape]``."""
    return tuple(torch.zeros((num_slots, *t.shape), dtype=t.dtype(dtype), device=device)
                 for t in slot_tensors(config))
