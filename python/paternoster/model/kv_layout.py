"""How a model's layers map onto KV cache groups and shared cache tensors.

A model whose layers do not all attend the same way (Gemma 3: five
sliding-window layers per global one; gpt-oss, Qwen2 with
``max_window_layers``: some of each) gets one *KV cache group* per kind of
layer, each with its own block tables over one shared block pool (the C++
``KVCacheManager``; vLLM's hybrid KV cache manager, vLLM v1 design docs,
"Hybrid KV Cache Manager"). A sliding-window group releases the blocks that
fall out of its window, so a long request holds about ``window /
block_size`` blocks there instead of ``context / block_size``.

The memory follows the blocks only if layers of different groups share
physical cache tensors: each kind's layers are split into groups of ``S``
layers (``S`` = the fewest layers of any kind), and the cache holds ``S``
*slots*, tensors ``[num_blocks, block_size, Hkv, D]`` for K and V. Layer
``j`` of every group uses slot ``j``; as block ids are never in two groups'
tables at once, they never collide. One block id then costs ``S`` layers of
KV, and a request costs, per group, its blocks times that. Models with one
kind of layer keep one group of all layers (``S`` = the layer count): the
layout before groups existed.

Recurrent layers (Gated DeltaNet in Qwen3-Next / Qwen3.5, LFM2's short
convolutions: :data:`RECURRENT_LAYER_TYPES`) keep a fixed-size state per
request instead of KV: they form one *recurrent-state group*, the last,
whose "table" is the request's state slot (the C++ manager's recurrent
groups); each such layer has its own state tensors
indexed by slot, and ``layer_slots`` numbers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: ``layer_types`` entries of layers that keep a fixed-size state per request
#: (:mod:`paternoster.model.recurrent_state` has their tensors): Gated
#: DeltaNet (Qwen3-Next, Qwen3.5) or Mamba2 (Nemotron-H, Granite 4.0-H; both
#: ``"linear_attention"`` in transformers 5) and LFM2's gated short convolution.
RECURRENT_LAYER_TYPES = ("linear_attention", "conv")
#: ``layer_types`` entries of layers without a token mixer, hence no cache:
#: Nemotron-H's MLP-only and MoE-only blocks.
CACHELESS_LAYER_TYPES = ("mlp", "moe")


@dataclass(frozen=True)
class KVCacheLayout:
    """Per-layer KV cache group and tensor slot, and each group's window.

    Attributes:
        group_windows: per group, its sliding window in tokens (0: full
            attention); the ``sliding_windows`` of ``_core.KVCacheManager``.
        layer_groups: per layer, its group.
        layer_slots: per layer, the index of the shared cache tensor it uses.
        num_slots: cache tensors (K and V each) to allocate.
        group_recurrent: per group, whether it is the recurrent-state group
            (empty: none is); for such a group's layers ``layer_slots`` is
            the layer's index among the recurrent layers.

    A layer without a cache (Nemotron-H's MLP-only blocks) has group and
    slot -1.
    """

    group_windows: tuple[int, ...]
    layer_groups: tuple[int, ...]
    layer_slots: tuple[int, ...]
    num_slots: int
    group_recurrent: tuple[bool, ...] = ()

    @classmethod
    def from_windows(cls, windows: Sequence[int], recurrent: Sequence[bool] = (),
                     cacheless: Sequence[bool] = ()) -> KVCacheLayout:
        """The layout for layers with these windows (0 = full attention).

        Kinds of layer are told apart by their window. Each kind's layers, in
        order, fill groups of ``S`` = the smallest kind's layer count (the
        last group of a kind may be short: at its blocks' ids the slots it has
        no layer for stay unwritten, memory allocated but unused). Layers
        marked in ``recurrent`` (one flag per layer, or empty) form one
        recurrent-state group after the others; layers marked in
        ``cacheless`` are in no group.

        Raises:
            ValueError: no layers, a negative window, ``recurrent`` or
                ``cacheless`` of another length, or no attention layer.
        """
        if not windows:
            raise ValueError("a model needs at least one layer")
        if any(w < 0 for w in windows):
            raise ValueError(f"sliding windows must be >= 0, got {list(windows)}")
        for name, flags in (("recurrent", recurrent), ("cacheless", cacheless)):
            if flags and len(flags) != len(windows):
                raise ValueError(f"{name} has {len(flags)} flags for {len(windows)} layers")
        state_layers = [i for i, r in enumerate(recurrent) if r]
        none = {i for i, c in enumerate(cacheless) if c}
        kinds: dict[int, list[int]] = {}
        for layer, w in enumerate(windows):
            if layer not in state_layers and layer not in none:
                kinds.setdefault(int(w), []).append(layer)
        if not kinds:
            raise ValueError("a model needs at least one attention layer")
        size = min(len(layers) for layers in kinds.values())
        group_windows: list[int] = []
        groups = [-1] * len(windows)
        slots = [-1] * len(windows)
        for w, layers in kinds.items():
            for start in range(0, len(layers), size):
                for slot, layer in enumerate(layers[start : start + size]):
                    groups[layer] = len(group_windows)
                    slots[layer] = slot
                group_windows.append(w)
        if not state_layers:
            return cls(tuple(group_windows), tuple(groups), tuple(slots), size)
        for index, layer in enumerate(state_layers):
            groups[layer] = len(group_windows)
            slots[layer] = index
        flags = (False,) * len(group_windows) + (True,)
        return cls((*group_windows, 0), tuple(groups), tuple(slots), size, flags)

    @property
    def recurrent_group(self) -> int | None:
        """The recurrent-state group's index, or None."""
        return self.group_recurrent.index(True) if any(self.group_recurrent) else None

    @property
    def num_recurrent_layers(self) -> int:
        """Layers in the recurrent-state group (each with its own state tensors)."""
        g = self.recurrent_group
        return 0 if g is None else sum(1 for x in self.layer_groups if x == g)

    @property
    def num_groups(self) -> int:
        """KV cache groups."""
        return len(self.group_windows)

    def blocks_for(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """Most blocks one request of ``num_tokens`` tokens holds at once.

        Full-attention groups hold every block; a sliding-window group of
        window ``W`` at most the blocks of the ``W - 1`` positions before a
        step's first token plus the step's ``chunk`` tokens (+ 1 for the
        alignment of both ends), and never more than all of them.

        Args:
            num_tokens: the request's context (prompt + output), >= 0.
            block_size: tokens per block, >= 1.
            chunk: most tokens one step computes for the request, >= 1.
        """
        every = -(-num_tokens // block_size)
        total = 0
        for g, w in enumerate(self.group_windows):
            if g == self.recurrent_group:  # a state slot, no blocks
                continue
            reach = -(-(w - 1 + chunk) // block_size) + 1 if w else every
            total += min(every, reach)
        return total

    def max_tokens(self, num_blocks: int, block_size: int, chunk: int, cap: int) -> int:
        """The longest context (at most ``cap``) one request can hold in
        ``num_blocks`` blocks (:meth:`blocks_for`); 0 if not even one token."""
        lo, hi = 0, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.blocks_for(mid, block_size, chunk) <= num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo


def layer_windows(hf_config) -> list[int]:
    """Each layer's attention window in tokens, 0 for full attention.

    A query at position ``p`` of a layer with window ``W`` sees the keys at
    ``p - W < k <= p`` (transformers' sliding-window causal mask). The config's
    ``sliding_window`` applies to the layers ``layer_types`` marks
    ``"sliding_attention"`` (Gemma 3, gpt-oss, Qwen2/3 with
    ``max_window_layers``; older Gemma 3 configs: all but every
    ``sliding_window_pattern``-th), to every layer when there is neither
    (Mistral, Mixtral, Phi-3), and to none when ``use_sliding_window`` is
    False (Qwen2/3's default).
    """
    n = int(hf_config.num_hidden_layers)
    window = getattr(hf_config, "sliding_window", None)
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return [0] * n
    layer_types = getattr(hf_config, "layer_types", None)
    pattern = getattr(hf_config, "sliding_window_pattern", None)
    if layer_types is None and pattern:  # older Gemma 3 configs: every pattern-th layer full
        layer_types = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention"
                       for i in range(n)]
    if layer_types is None:
        return [int(window)] * n
    if len(layer_types) != n:
        raise ValueError(f"config.layer_types has {len(layer_types)} entries for {n} layers")
    return [int(window) if t == "sliding_attention" else 0 for t in layer_types]


def kv_cache_layout(hf_config) -> KVCacheLayout:
    """The layout of a model's layers: attention windows from
    :func:`layer_windows`, the layers ``layer_types`` marks with one of
    :data:`RECURRENT_LAYER_TYPES` in the recurrent-state group, and those it
    marks with one of :data:`CACHELESS_LAYER_TYPES` in none."""
    types = getattr(hf_config, "layer_types", None) or ()
    recurrent = [t in RECURRENT_LAYER_TYPES for t in types]
    cacheless = [t in CACHELESS_LAYER_TYPES for t in types]
    return KVCacheLayout.from_windows(layer_windows(hf_config),
                                      recurrent if any(recurrent) else (),
                                      cacheless if any(cacheless) else ())
