"""Per-request sampling parameters (the OpenAI/vLLM knobs the engine honours)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from paternoster.structured_outputs import gate_token_ids, normalize_spec

_GREEDY_EPS = 1e-5
MAX_N = 128  # most completions per request
MAX_LOGPROBS = 20  # most top logprobs per token (OpenAI's and vLLM's default cap)
MAX_LOGIT_BIAS = 100.0  # |bias| cap (OpenAI)
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
        presence_penalty: OpenAI presence penalty in ``[-2, 2]``: subtracted once
            from the logit of every token already generated (prompt excluded).
        frequency_penalty: OpenAI frequency penalty in ``[-2, 2]``: subtracted
            from a token's logit once per time it was generated.
        repetition_penalty: HF/CTRL repetition penalty ``> 0`` (``1`` disables)
            over prompt and generated tokens: a seen token's positive logit is
            divided by it, a negative one multiplied.
        min_tokens: generate at least this many tokens (>= 0): EOS and
            ``stop_token_ids`` are masked until then, and stop strings are not
            matched in the text of the first ``min_tokens`` tokens (vLLM).
        logit_bias: ``{token id: bias}`` added to the logits before sampling;
            bias in ``[-100, 100]``.
        logprobs: return the log-probability of each generated token plus this
            many most likely alternatives (``0..MAX_LOGPROBS``); ``None``: none.
            Values are the model's own distribution ("raw", vLLM's default):
            before penalties, bias, temperature and top-k/top-p/min-p.
        prompt_logprobs: likewise for every prompt token after the first
            (``None``: none).
        include_stop_str_in_output: keep the matched stop string (or the stop
            token's text) in the returned text.
        skip_special_tokens: leave special tokens out of the returned text.
        allowed_token_ids: only these token ids may be generated (vLLM); every
            other logit is -inf. ``None``: all. A non-empty list of ids.
        bad_words: words never generated (vLLM): each word's token sequence
            is banned (its last token masked whenever the output ends with the
            tokens before it), as written and, when that tokenizes to as many
            tokens, also after a space (vLLM's rule; list both forms to be sure).
        structured_outputs: constrain the output (vLLM's field): a map with
            exactly one of ``json`` (a JSON schema), ``json_object`` (true),
            ``regex``, ``choice`` (a list of strings) or ``grammar`` (EBNF);
            see :mod:`paternoster.structured_outputs`; optionally also
            ``reasoning`` (the reasoning gate: the constraint applies after
            the model's reasoning; :mod:`paternoster.reasoning_gate`). Kept in
            canonical form (:func:`~paternoster.structured_outputs.normalize_spec`).
        bad_words_token_ids: (derived by :meth:`prepare` from ``bad_words``;
            not a request field) the token sequences to ban.
        needs_logits_processing: (derived, set by :meth:`validate`) True when
            penalties, ``logit_bias`` or ``min_tokens`` change the logits.
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    structured_outputs: dict[str, Any] | None = None
    bad_words_token_ids: list[list[int]] | None = field(default=None,
                                                        metadata={"derived": True})  # fmt: skip

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.logit_bias, list):  # the wire form: [[token id, bias], ...]
            self.logit_bias = {int(t): b for t, b in self.logit_bias}
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        if self.structured_outputs is not None:
            self.structured_outputs = normalize_spec(self.structured_outputs)
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
        self._validate_processing()
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not _is_int(k) or not 0 <= k <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {k!r}")
        allowed = self.allowed_token_ids
        if allowed is not None and (not isinstance(allowed, list) or not allowed):
            raise ValueError("allowed_token_ids must be a non-empty list of token ids")
        if allowed is not None and not all(_is_int(t) and t >= 0 for t in allowed):
            raise ValueError(f"allowed_token_ids must be token ids (integers >= 0), "
                             f"got {allowed!r}")
        if self.bad_words is not None:
            if not all(isinstance(w, str) and w.strip() for w in self.bad_words):
                raise ValueError("bad_words must be a list of non-empty strings")
            if not all(_is_text(w) for w in self.bad_words):
                raise ValueError("bad_words must be valid Unicode text")
        # A plain attribute, not a property: the engine reads it for every row every step.
        self.needs_logits_processing = bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.min_tokens or self.logit_bias or self.allowed_token_ids
            or self.bad_words_token_ids
        )

    def _validate_processing(self) -> None:
        """Ranges of penalties, ``min_tokens`` and ``logit_bias``."""
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2.0 <= v <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {v!r}")
        rp = self.repetition_penalty
        if not _is_number(rp) or math.isinf(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {rp!r}")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        for t, b in (self.logit_bias or {}).items():
            if not _is_int(t) or t < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            if not _is_number(b) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
                raise ValueError(
                    f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                    f"got {b!r} for token {t}"
                )

    def check_token_ids(self, vocab_size: int) -> None:
        """Check every token-id field against the vocabulary.

        Raises:
            ValueError: naming the first field with an id outside ``[0, vocab_size)``.
        """
        for name, ids in self._token_id_fields():
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} must be token ids in [0, {vocab_size}), got {bad[0]}")

    def _token_id_fields(self) -> list[tuple[str, list[int]]]:
        """``(field, token ids)`` of every field that holds token ids."""
        return [("stop_token_ids", self.stop_token_ids),
                ("logit_bias", list(self.logit_bias or ())),
                ("allowed_token_ids", self.allowed_token_ids or []),
                *gate_token_ids(self.structured_outputs or {})]  # fmt: skip

    def prepare(self, tokenizer: Any) -> SamplingParams:
        """These params with the fields derived through the tokenizer filled in
        (the frontend calls it once per request; the engine has no tokenizer).

        Args:
            tokenizer: the model's Hugging Face tokenizer.
        Returns:
            ``self`` when nothing is derived, else a new :class:`SamplingParams`.
        """
        if not self.bad_words or self.bad_words_token_ids is not None:
            return self
        return dataclasses.replace(self, bad_words_token_ids=_bad_words_token_ids(
            self.bad_words, tokenizer))  # fmt: skip

    def to_dict(self) -> dict:
        """Plain dict of every field (msgpack-safe: ``logit_bias`` as
        ``[[token id, bias], ...]`` pairs, since msgpack map keys are strings)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.logit_bias:
            d["logit_bias"] = [[t, float(b)] for t, b in self.logit_bias.items()]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        """Inverse of :meth:`to_dict`. Raises ValueError on unknown or bad fields."""
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampling fields: {sorted(unknown)}")
        return cls(**d)


def _bad_words_token_ids(words: list[str], tokenizer: Any) -> list[list[int]]:
    """Each word's token ids, as written and after a space (a word inside text
    usually follows one), after vLLM: the spaced form is kept when it is a
    different first token of the same length."""
    out: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if plain:
            out.append(plain)
        if spaced and (not plain or (spaced[0] != plain[0] and len(spaced) == len(plain))):
            out.append(spaced)
    return out


def request_fields() -> tuple[str, ...]:
    """The fields a request may set (every field not marked ``derived``: those
    are filled in by :meth:`SamplingParams.prepare`). The HTTP and ZeroMQ
    protocols take their sampling fields from here."""
    return tuple(f.name for f in fields(SamplingParams) if not f.metadata.get("derived"))


def _is_text(text: str) -> bool:
    """True when ``text`` encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
