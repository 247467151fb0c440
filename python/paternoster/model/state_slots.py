"""Where each sequence of a step keeps its recurrent state: the token mixers
with a fixed-size state per request (Gated DeltaNet, LFM2's short
convolution, Mamba2) read one *state slot* per sequence, column 0 of its row
in their KV cache group's block table (the C++ ``KVCacheManager``'s
recurrent-state group, :mod:`paternoster.model.kv_layout`), and run a
sequence's prompt chunk on its own and the step's one-token decodes batched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paternoster.model.attention import AttentionMetadata


@dataclass(frozen=True, slots=True)
class SlotSpan:
    """One sequence of a step.

    Attributes:
        slot: its state slot. lo, hi: its rows ``[lo, hi)`` of the step.
        fresh: the step starts the sequence (no computed tokens before it):
            its state is to be zeroed first.
    """

    slot: int
    lo: int
    hi: int
    fresh: bool

    @property
    def decode(self) -> bool:
        """One token continuing a sequence (batched with the others)."""
        return self.hi - self.lo == 1 and not self.fresh


def slot_spans(attn: AttentionMetadata, group: int) -> list[SlotSpan]:
    """The step's sequences in batch order, with their state slots in KV
    cache group ``group`` (a recurrent-state group)."""
    slots = attn.for_group(group)[1][:, 0].tolist()
    starts = attn.query_start_loc.tolist()
    seq_lens = attn.seq_lens.tolist()
    return [SlotSpan(slot, starts[i], starts[i + 1], seq_lens[i] == starts[i + 1] - starts[i])
            for i, slot in enumerate(slots)]


def decode_index(spans: list[SlotSpan],
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The decoding sequences' rows and state slots (int64 ``[B]`` each), or
    None if none decodes."""
    decodes = [s for s in spans if s.decode]
    if not decodes:
        return None
    return (torch.tensor([s.lo for s in decodes], device=device),
            torch.tensor([s.slot for s in decodes], device=device))
