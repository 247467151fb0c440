"""Log-probabilities of a run of tokens, as the engine computes and sends them.

One :class:`Logprobs` holds, for each of T tokens, the token's own
log-probability and the ``k`` most likely tokens at that position with theirs
(natural log, float32 precision, as Python floats). On the wire it is a list of
three lists, ``[token_logprobs, top_token_ids, top_logprobs]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the frontend imports this module and must not import torch
    import torch


@dataclass(slots=True)
class Logprobs:
    """Log-probabilities of T consecutive tokens of one sequence.

    Attributes:
        token_logprobs: [T] log-probability of each token.
        top_token_ids: [T][k] the ``k`` most likely token ids at each
            position, most likely first (``k`` may be 0).
        top_logprobs: [T][k] their log-probabilities.
    """

    token_logprobs: list[float] = field(default_factory=list)
    top_token_ids: list[list[int]] = field(default_factory=list)
    top_logprobs: list[list[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_logprobs)

    def position(self, i: int) -> Logprobs:
        """Position ``i`` alone, as a one-position :class:`Logprobs`."""
        return Logprobs([self.token_logprobs[i]], [self.top_token_ids[i]], [self.top_logprobs[i]])

    def extend(self, other: Logprobs) -> None:
        """Append ``other``'s positions after ours."""
        self.token_logprobs.extend(other.token_logprobs)
        self.top_token_ids.extend(other.top_token_ids)
        self.top_logprobs.extend(other.top_logprobs)

    def to_wire(self) -> list:
        """``[token_logprobs, top_token_ids, top_logprobs]`` (msgpack-safe)."""
        return [self.token_logprobs, self.top_token_ids, self.top_logprobs]

    @classmethod
    def from_wire(cls, wire: list) -> Logprobs:
        """Inverse of :meth:`to_wire`.

        Raises:
            ValueError: not three lists of the same length.
        """
        if not isinstance(wire, list) or len(wire) != 3:
            raise ValueError("logprobs must be [token_logprobs, top_token_ids, top_logprobs]")
        lps, ids, tops = wire
        if not (isinstance(lps, list) and isinstance(ids, list) and isinstance(tops, list)) or \
                not len(lps) == len(ids) == len(tops):
            raise ValueError("logprobs lists must have the same length")
        return cls(list(lps), list(ids), list(tops))


def compute_logprobs(log_probs: torch.Tensor, token_ids: torch.Tensor,
                     num_top: list[int]) -> Logprobs:
    """Each row's token log-probability and its top-``k`` alternatives.

    Args:
        log_probs: float32 [R, V], already normalised (``log_softmax`` of the
            logits).
        token_ids: int64 [R], the token whose log-probability each row reports.
        num_top: R counts ``k >= 0`` of alternatives per row (capped at V).
    Returns:
        :class:`Logprobs` with R positions (one ``tolist`` per tensor, no loop
        over the vocabulary).
    Raises:
        ValueError: mismatched lengths.
    """
    rows = log_probs.shape[0]
    if token_ids.shape != (rows,) or len(num_top) != rows:
        raise ValueError(
            f"got {rows} rows, token_ids of shape {tuple(token_ids.shape)} and "
            f"{len(num_top)} top-k counts"
        )
    if rows == 0:
        return Logprobs()
    own = log_probs.gather(1, token_ids.to(log_probs.device).view(-1, 1)).squeeze(1).tolist()
    k = min(max(num_top), log_probs.shape[1])
    if k > 0:
        values, index = log_probs.topk(k, dim=-1)
        values, index = values.tolist(), index.tolist()
    else:
        values, index = [[] for _ in range(rows)], [[] for _ in range(rows)]
    if k == max(num_top) == min(num_top):
        return Logprobs(own, index, values)
    return Logprobs(own, [ids[:n] for ids, n in zip(index, num_top)],
                    [v[:n] for v, n in zip(values, num_top)])
