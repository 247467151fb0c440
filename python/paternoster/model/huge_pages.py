"""CPU weights and KV caches on transparent huge pages (2 MiB).

A decode step streams every weight once; at batch 1 on the CPU it is bound by
how fast memory delivers them. With 4 KiB pages a 270 MB model spans 66,000
pages, and the GEMV's streams miss the TLB at every page boundary: on the
2-core AVX-512 EPYC development VM a pass over SmolLM2-135M's 121 bfloat16
matrices through the core's linear kernel took 13.4 / 12.8 ms on 4 KiB pages
and 10.7 / 10.2 ms on 2 MiB pages (a throwaway C++ driver, two processes of
each, 15 interleaved passes, median), the gain a plain read loop showed too
(11.3 -> 8.8 ms). torch's CPU allocator returns 4 KiB-page memory unless the
process started with ``THP_MEM_ALLOC_ENABLE=1``, which an in-process
:class:`~paternoster.LLM` cannot rely on, so the runner copies the weights
into one anonymous mapping advised with ``MADV_HUGEPAGE`` (Linux
``madvise(2)``; honoured when ``/sys/kernel/mm/transparent_hugepage/enabled``
is ``always`` or ``madvise``) and points the parameters at it.

Same values, same layout (contiguous, as before): results are bit-identical.
``PATERNOSTER_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
from dataclasses import dataclass

import torch
from torch import nn

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
#: Tensors smaller than this stay where they are (norm weights, biases); larger
#: ones are packed together, so matrices under 2 MiB share huge pages.
MIN_BYTES = 1 << 16
#: Offsets of the tensors in the arena are multiples of this (a cache line).
ALIGN = 64


def enabled() -> bool:
    """False when ``PATERNOSTER_HUGE_PAGES`` is ``0`` (or ``false``/``no``/``off``),
    or when ``madvise(MADV_HUGEPAGE)`` does not exist here (not Linux)."""
    off = os.environ.get("PATERNOSTER_HUGE_PAGES", "1").strip().lower() in ("0", "false",
                                                                            "no", "off")
    return not off and hasattr(mmap, "MADV_HUGEPAGE")


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """A zero-filled uint8 tensor ``[nbytes]`` on an anonymous mapping advised
    with ``MADV_HUGEPAGE``, starting on a 2 MiB boundary. The tensor keeps
    the mapping alive.

    Raises:
        ValueError: ``nbytes`` < 1.
        OSError: the mapping failed (out of memory).
    """
    if nbytes < 1:
        raise ValueError(f"nbytes must be >= 1, got {nbytes}")
    # Private: Python's default for an anonymous map is MAP_SHARED, which is
    # shmem, whose huge pages follow another switch (shmem_enabled, "never").
    mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mm, dtype=torch.uint8)  # holds a reference to mm
    start = (-whole.data_ptr()) % HUGE_PAGE
    return whole[start:start + nbytes]


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled contiguous CPU tensor on huge pages (:func:`huge_page_buffer`),
    or ``torch.zeros`` when disabled (:func:`enabled`). Written once here, as
    ``torch.zeros`` does, so the memory is committed now: a KV cache larger than
    the machine fails at start, not under load hours later."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not enabled() or nbytes < 1:
        return torch.zeros(shape, dtype=dtype)
    out = huge_page_buffer(nbytes).view(dtype).view(shape)
    out.zero_()  # fault every page in (the mapping is lazily backed)
    return out


@dataclass(frozen=True)
class Placement:
    """What :func:`place_weights` moved: tensors, bytes, and how many of those
    bytes the kernel backs with huge pages (``AnonHugePages`` of the mapping)."""

    num_tensors: int
    nbytes: int
    huge_bytes: int


def _weights(model: nn.Module) -> list[tuple[object, str, torch.Tensor]]:
    """(owner, attribute, tensor) of every CPU parameter and kept-quantized
    weight of at least :data:`MIN_BYTES`, contiguous; quantized weights that
    view a mapped file (a GGUF file) stay where they are: copying them would
    hold the file twice in memory."""
    from paternoster.kernels.quant import QuantizedWeight, WeightParts

    out = []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            out.append((module, name, p))
        for value in vars(module).values():
            parts = value.parts if isinstance(value, WeightParts) else (value,)
            out += [(p, "data", p.data) for p in parts
                    if isinstance(p, QuantizedWeight) and not p.mapped]
    return [(o, a, t) for o, a, t in out
            if t.device.type == "cpu" and t.nbytes >= MIN_BYTES and t.is_contiguous()]


def place_weights(model: nn.Module) -> Placement | None:
    """Copy ``model``'s large CPU weights into one huge-page mapping and point
    the parameters (and :class:`~paternoster.kernels.quant.QuantizedWeight`
    data) at their copies; tensors that shared storage still share it. Call it
    before anything takes raw pointers to the weights (the core's decoder
    stack is built at the first step).

    Returns:
        What moved, or ``None`` when disabled (:func:`enabled`) or nothing
        qualifies.
    """
    if not enabled():
        return None
    # Group the owners of each tensor (keys taken before anything moves: moving
    # a Parameter changes its data_ptr); hold no tensor here, so that each old
    # one is freed as soon as its owners point at the copy (peak: the weights
    # plus one tensor, not twice the weights).
    groups: dict[tuple, list[tuple[object, str]]] = {}
    sizes: dict[tuple, int] = {}
    for owner, attr, t in _weights(model):
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        groups.setdefault(key, []).append((owner, attr))
        sizes[key] = t.nbytes
    t = None
    if not groups:
        return None
    total = sum((n + ALIGN - 1) // ALIGN * ALIGN for n in sizes.values())
    arena = huge_page_buffer(total)
    before = _anon_huge_bytes()
    off = 0
    for key, owners in groups.items():
        _, dtype, shape = key
        src = getattr(*owners[0])
        dst = arena[off:off + sizes[key]].view(dtype).view(shape)
        off += (sizes[key] + ALIGN - 1) // ALIGN * ALIGN
        with torch.no_grad():
            dst.copy_(src)
        for owner, attr in owners:
            value = getattr(owner, attr)
            if isinstance(value, nn.Parameter):
                value.data = dst  # the Parameter object stays: tied weights stay tied
            else:
                object.__setattr__(owner, attr, dst)  # QuantizedWeight is frozen
        src = value = None
    placed = Placement(len(groups), total, max(0, _anon_huge_bytes() - before))
    logger.info("weights: %.1f MB in %d tensors moved to a huge-page mapping "
                "(%.1f MB on 2 MiB pages)", total / 1e6, len(groups), placed.huge_bytes / 1e6)
    return placed


def _anon_huge_bytes() -> int:
    """This process's ``AnonHugePages`` (bytes), 0 where it cannot be read."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
