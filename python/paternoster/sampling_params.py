"""Per-request sampling parameters (the OpenAI/vLLM knobs the engine honours)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5
MAX_N = 128  # most completions per request
_SEED_LIMIT = 2**63  # seeds (and seed + n - 1) must fit a signed 64-bit integer


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    Semantics follow vLLM's ``SamplingParams`` where OpenAI is silent.

    Attributes:
        n: number of independent completions for the prompt, in
            ``[1, MAX_N]``. The frontend fans a request out into ``n`` engine
            requests.
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_p: nucleus sampling mass in ``(0, 1]``.
        top_k: keep the ``k`` most likely tokens; ``-1`` (or ``0``) disables.
        min_p: drop tokens whose probability is below ``min_p`` times the
            most likely token's probability; ``0`` disables. In ``[0, 1]``.
        seed: per-request RNG seed in ``[0, 2**63 - n]``; choice ``i`` uses
            ``seed + i``. The random draws come from a per-request
            ``torch.Generator``, so they do not depend on the rest of the batch
            (in bfloat16 the logits themselves can differ slightly with the
            batch shape; in float32 the same seed gives the same tokens).
        max_tokens: maximum number of generated tokens (>= 1), or ``None`` for
            "up to the context length".
        stop: stop strings; matched by the frontend on the detokenized text and
            excluded from the returned text.
        stop_token_ids: token ids that end generation (``finish_reason="stop"``);
            the stop token itself is not part of the returned text.
        ignore_eos: keep generating past the EOS token.
    Raises:
        ValueError: from :meth:`validate`, naming the offending field.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    @property
    def greedy(self) -> bool:
        """True when the temperature is (numerically) zero: argmax sampling."""
        return self.temperature < _GREEDY_EPS

    def validate(self) -> None:
        """Check every field's range.

        Raises:
            ValueError: naming the first field out of range.
        """
        if not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(
                f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {self.top_k!r}"
            )
        mp = self.min_p
        if not isinstance(mp, (int, float)) or math.isnan(mp) or not 0.0 <= mp <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {mp!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or not 0 <= self.seed <= _SEED_LIMIT - self.n
        ):
            raise ValueError(
                f"seed must be an integer in [0, 2**63 - n] (n = {self.n}), got {self.seed!r}"
            )
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        for s in self.stop:
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("stop must be valid Unicode text") from None
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be a list of non-negative integers")

    def to_dict(self) -> dict:
        """Plain dict of the fields (msgpack-safe)."""
        return {
            "n": self.n,
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": int(self.top_k),
            "min_p": float(self.min_p),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "ignore_eos": bool(self.ignore_eos),
        }

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        """Inverse of :meth:`to_dict`. Raises ValueError on unknown or bad fields."""
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampling fields: {sorted(unknown)}")
        return cls(**d)
