"""The reasoning gate of structured outputs: a reasoning model's constraint
applies to its answer, never to its reasoning.

A ``structured_outputs`` map may carry, next to its constraint, the key
``reasoning``: ``{"end": [token ids], "start": [token id] or [],
"in_reasoning": bool}`` (the frontend fills it from the model's reasoning
parser: ``end`` is the tag that closes the reasoning, e.g. ``</think>``;
``start`` the one-token tag that opens it; ``in_reasoning`` whether the prompt
already opened it, as chat templates that end in ``<think>`` do). As vLLM
does, the grammar is held back, neither masking nor advancing, while the model
reasons:

- ``in_reasoning`` true: the grammar starts with the token after the first
  occurrence of ``end`` in the output;
- ``in_reasoning`` false with ``start`` ``[S]``: the first token may be the
  grammar's or ``S``; ``S`` opens the reasoning (then as above, ``end``
  searched after ``S``), any other token is the answer's first;
- ``in_reasoning`` false without ``start``: no gate, the whole output is the
  answer.

While the grammar is held back the request samples as an unconstrained one
(EOS included: a request that stops or is cut off while reasoning finishes
as a free one would, ``stop`` or ``length``). :class:`ReasoningGate` is the
state (kept, like the grammar's, on the request; it rereads the output
tokens, so it follows them exactly, through preemption too); the grammar's
:class:`~paternoster.structured_outputs.GrammarState` consults it.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

#: The keys of a ``structured_outputs.reasoning`` map.
GATE_KEYS = ("end", "start", "in_reasoning")


def normalize_gate(value: Any) -> dict[str, Any]:
    """A ``structured_outputs.reasoning`` map in canonical form: every key of
    :data:`GATE_KEYS` (``start`` default ``[]``, ``in_reasoning`` default
    false). Token ids are checked against the vocabulary later
    (:meth:`~paternoster.sampling_params.SamplingParams.check_token_ids`).

    Raises:
        ValueError: naming ``structured_outputs.reasoning`` or one of its
            keys: not a map, an unknown key, ``end`` not a non-empty list of
            token ids, ``start`` not a list of at most one token id (a start
            tag of several tokens is not supported), ``in_reasoning`` not a bool.
    """
    where = "structured_outputs.reasoning"
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object with {', '.join(GATE_KEYS)}, "
                         f"got {type(value).__name__}")
    unknown = sorted(set(value) - set(GATE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; use {', '.join(GATE_KEYS)}")
    end = value.get("end")
    if not _token_ids(end) or not end:
        raise ValueError(f"{where}.end must be a non-empty list of token ids")
    start = value.get("start")
    if start is None:
        start = []
    if not _token_ids(start):
        raise ValueError(f"{where}.start must be a list of token ids")
    if len(start) > 1:
        raise ValueError(f"{where}.start must be at most one token id (a start tag of "
                         f"{len(start)} tokens is not supported)")
    in_reasoning = value.get("in_reasoning", False)
    if not isinstance(in_reasoning, bool):
        raise ValueError(f"{where}.in_reasoning must be true or false")
    return {"end": list(end), "start": list(start), "in_reasoning": in_reasoning}


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


class Phase(Enum):
    OPENING = "opening"  # the first token: the answer's or the start tag
    REASONING = "reasoning"  # the grammar waits for the end tag
    ANSWERING = "answering"  # the grammar applies


class ReasoningGate:
    """Where one request's output stands: reasoning (the grammar held back)
    or answering (the grammar applies from :meth:`find_end`'s index on).

    Args:
        end: the token ids closing the reasoning.
        start: the token id opening it, or None.
        in_reasoning: the output starts inside the reasoning.
    """

    def __init__(self, end: list[int], start: int | None, in_reasoning: bool) -> None:
        self._end = list(end)
        self._start = start
        # Output index where the reasoning's text begins (the end tag is searched from there).
        self._reasoning_from = 0
        # Exclusive end of the next window of the output compared with the end tag.
        self._next_window = len(self._end)
        self.phase = Phase.REASONING if in_reasoning else Phase.OPENING

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> ReasoningGate | None:
        """The gate of a normalized ``structured_outputs.reasoning`` map; None
        when there is none or it never holds the grammar back (not in
        reasoning and no start tag)."""
        if spec is None or not (spec["in_reasoning"] or spec["start"]):
            return None
        return cls(spec["end"], spec["start"][0] if spec["start"] else None,
                   spec["in_reasoning"])

    @property
    def start_token(self) -> int | None:
        """The start tag's token while it may still open the reasoning (the
        first token), else None."""
        return self._start if self.phase is Phase.OPENING else None

    def opens_reasoning(self, token: int) -> bool:
        """Take the output's first token (only in the opening phase): True if
        it is the start tag (the reasoning begins), False if it is the
        answer's first token (from now on the grammar applies)."""
        if self.phase is not Phase.OPENING:
            raise ValueError(f"the first token was taken already (phase {self.phase.value})")
        if token == self._start:
            self.phase = Phase.REASONING
            self._reasoning_from = 1
            self._next_window = 1 + len(self._end)
            return True
        self.phase = Phase.ANSWERING
        return False

    def find_end(self, output_token_ids: list[int]) -> int | None:
        """Look for the end tag in the output tokens not searched yet (the
        reasoning phase only; each token is compared once per tag position).

        Returns:
            The index of the answer's first token (just past the tag: the
            output's length when the tag ends it) once the tag is found, the
            gate then answering; None while the reasoning goes on.
        """
        if self.phase is not Phase.REASONING:
            raise ValueError(f"not reasoning (phase {self.phase.value})")
        n = len(self._end)
        i = self._next_window
        while i <= len(output_token_ids):
            if output_token_ids[i - n : i] == self._end:
                self.phase = Phase.ANSWERING
                return i
            i += 1
        self._next_window = i
        return None
