"""Workloads for the serving benchmark: prompts of a given length and arrival times.

Three sources, all seeded:

- ``mix``: a representative mix of classes (short answers, long summaries, long
  generations, long prompts), each with a share and token-length ranges; see
  :data:`DEFAULT_MIX` and :func:`parse_mix` for the ``--mix`` syntax.
- ``random``: every request ``input_len``/``output_len`` tokens, optionally
  spread uniformly by ``range_ratio`` (vLLM's ``random`` dataset).
- ``jsonl:PATH``: one JSON object per line with ``prompt`` (text) or
  ``prompt_len`` (tokens), optional ``output_len`` (tokens), ``arrival_time``
  (seconds from the start, replayed with ``--trace-timing``) and ``tag``; the
  simulator's traces (docs/simulator.md) load as they are (``priority`` and
  ``request_id`` are accepted and ignored).

Prompts need no tokenizer: :class:`PromptMaker` strings together common English
words, which BPE tokenizers (Llama, Qwen, SmolLM) encode as one token each
(with their leading space), so ``n`` words is about ``n`` tokens; given a
tokenizer it hits ``n`` tokens exactly. Prompts are random word sequences, so
no two share a prefix (prefix caching cannot flatter TTFT).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their has been if more when "
    "will would who so no time people year way day man thing woman life child world school "
    "state family student group country problem hand part place case week company system "
    "program question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name team "
    "minute idea body information back parent face others level office door health person "
    "art war history party result change morning reason research girl moment air teacher "
    "force education"
).split()


@dataclass(frozen=True)
class BenchRequest:
    """One request of a benchmark workload.

    Attributes:
        prompt: the text sent (the completions ``prompt`` or the chat user message).
        prompt_len: intended prompt length in tokens (exact with a tokenizer,
            else a word count); the server's ``usage.prompt_tokens`` is what is reported.
        output_len: ``max_tokens`` to request (tokens, >= 1).
        tag: the workload class (``short``, ``summary``, ... or the trace's tag).
        arrival_time: seconds from the start of the run, only from a JSONL trace.
    """

    prompt: str
    prompt_len: int
    output_len: int
    tag: str | None = None
    arrival_time: float | None = None


class PromptMaker:
    """Builds prompt text of a requested length from a seeded word stream.

    Args:
        tokenizer: a Hugging Face tokenizer for exact token counts, or ``None``
            (``n`` common words, about ``n`` tokens for BPE vocabularies).
        seed: RNG seed (an int, or a sequence of ints as ``numpy.random.default_rng``
            takes them: ``(seed, k)`` gives a stream independent of ``seed``'s).
    """

    def __init__(self, tokenizer: Any | None = None, seed: int | Sequence[int] = 0) -> None:
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(seed)

    def _words(self, n: int) -> str:
        idx = self.rng.integers(0, len(_WORDS), size=n)
        return " ".join(_WORDS[i] for i in idx)

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens), or its words without a tokenizer."""
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def make(self, n: int) -> str:
        """A prompt of ``n`` tokens (``n`` words without a tokenizer).

        Raises:
            ValueError: ``n < 1``.
        """
        if n < 1:
            raise ValueError(f"prompt length must be >= 1 token, got {n}")
        if self.tokenizer is None:
            return self._words(n)
        tok = self.tokenizer
        ids = tok.encode(self._words(n + 8), add_special_tokens=False)
        while len(ids) < n:
            ids += tok.encode(" " + self._words(n), add_special_tokens=False)
        k = n
        text = tok.decode(ids[:k])
        for _ in range(8):  # decode/encode may merge or split at the edges: adjust
            m = len(tok.encode(text, add_special_tokens=False))
            if m == n:
                break
            k = max(1, min(len(ids), k + n - m))
            text = tok.decode(ids[:k])
        return text


@dataclass(frozen=True)
class MixClass:
    """One class of the mix.

    Attributes:
        tag: its name. share: relative weight (> 0).
        prompt_len: inclusive ``(lo, hi)`` prompt tokens, drawn uniformly.
        output_len: inclusive ``(lo, hi)`` output tokens, drawn uniformly.
    """

    tag: str
    share: float
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]


#: Short answers, long summaries, long generations, a few long prompts (tokens).
DEFAULT_MIX: tuple[MixClass, ...] = (
    MixClass("short", 0.60, (16, 256), (8, 64)),
    MixClass("summary", 0.25, (512, 2048), (64, 256)),
    MixClass("long_gen", 0.10, (16, 128), (256, 768)),
    MixClass("long_prompt", 0.05, (2048, 4096), (8, 64)),
)


def parse_mix(spec: str) -> tuple[MixClass, ...]:
    """Parse ``--mix``: comma-separated ``TAG=SHARE:PLO-PHI:OLO-OHI`` classes,
    e.g. ``short=0.7:16-256:8-64,summary=0.3:512-1024:64-128`` (token lengths).

    Raises:
        ValueError: malformed spec or a value out of range (the message names it).
    """
    classes = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        try:
            tag, rest = part.split("=", 1)
            share, p, o = rest.split(":")
            prange = tuple(int(x) for x in p.split("-"))
            orange = tuple(int(x) for x in o.split("-"))
            c = MixClass(tag.strip(), float(share), prange, orange)  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(
                f"bad --mix class {part!r}: want TAG=SHARE:PLO-PHI:OLO-OHI, "
                "e.g. short=0.7:16-256:8-64"
            ) from None
        for name in ("prompt_len", "output_len"):
            r = getattr(c, name)
            if len(r) != 2 or not 1 <= r[0] <= r[1]:
                raise ValueError(
                    f"--mix class {c.tag!r}: {name} range must be LO-HI, 1 <= LO <= HI"
                )
        if not c.share > 0:
            raise ValueError(f"--mix class {c.tag!r}: share must be > 0")
        classes.append(c)
    if not classes:
        raise ValueError("--mix is empty")
    return tuple(classes)


def fit_context(prompt_len: int, output_len: int, max_model_len: int | None) -> tuple[int, int]:
    """Shrink ``(prompt_len, output_len)`` tokens so that they fit ``max_model_len``:
    the output keeps at most half of it, the prompt the rest. ``None`` = no limit.

    Raises:
        ValueError: ``max_model_len < 2``.
    """
    if max_model_len is None or prompt_len + output_len <= max_model_len:
        return prompt_len, output_len
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 tokens, got {max_model_len}")
    output_len = min(output_len, max_model_len // 2)
    return min(prompt_len, max_model_len - output_len), output_len


def make_mix(
    n: int,
    maker: PromptMaker,
    classes: Sequence[MixClass] = DEFAULT_MIX,
    max_model_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """``n`` requests drawn from ``classes`` (seeded; the first ``k`` requests of
    a larger ``n`` are the same), lengths fitted to ``max_model_len`` tokens.

    Raises:
        ValueError: ``n < 1`` or an empty ``classes``.
    """
    if n < 1 or not classes:
        raise ValueError(f"need n >= 1 and at least one class, got n={n}")
    rng = np.random.default_rng(seed)
    shares = np.array([c.share for c in classes], dtype=np.float64)
    out = []
    for _ in range(n):
        c = classes[int(rng.choice(len(classes), p=shares / shares.sum()))]
        p = int(rng.integers(c.prompt_len[0], c.prompt_len[1] + 1))
        o = int(rng.integers(c.output_len[0], c.output_len[1] + 1))
        p, o = fit_context(p, o, max_model_len)
        out.append(BenchRequest(maker.make(p), p, o, c.tag))
    return out


def make_random(
    n: int,
    maker: PromptMaker,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    max_model_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """``n`` requests of ``input_len`` prompt and ``output_len`` output tokens, each
    drawn uniformly from ``[len * (1 - range_ratio), len * (1 + range_ratio)]``.

    Raises:
        ValueError: ``n``, ``input_len`` or ``output_len`` < 1, or
            ``range_ratio`` outside ``[0, 1)``.
    """
    if n < 1 or input_len < 1 or output_len < 1:
        raise ValueError(
            f"n, input_len, output_len must be >= 1, got {n}, {input_len}, {output_len}"
        )
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)

    def draw(x: int) -> int:
        lo, hi = max(1, math.floor(x * (1 - range_ratio))), math.ceil(x * (1 + range_ratio))
        return int(rng.integers(lo, hi + 1))

    out = []
    for _ in range(n):
        p, o = fit_context(draw(input_len), draw(output_len), max_model_len)
        out.append(BenchRequest(maker.make(p), p, o, "random"))
    return out


def with_shared_prefix(requests: Sequence[BenchRequest], prefix: str,
                       prefix_len: int) -> list[BenchRequest]:
    """Put one shared ``prefix`` (``prefix_len`` tokens) before every prompt, as a
    system prompt or few-shot examples would be: vLLM's ``--random-prefix-len``.

    The prompt becomes ``prefix + " " + prompt``; with word prompts and a BPE
    vocabulary the prefix tokenizes the same in every request, so a prefix cache
    can reuse it. ``prompt_len`` grows by ``prefix_len``.

    Raises:
        ValueError: ``prefix_len < 1`` or an empty ``prefix``.
    """
    if prefix_len < 1 or not prefix:
        raise ValueError(f"prefix_len must be >= 1 with a non-empty prefix, got {prefix_len}")
    return [
        BenchRequest(f"{prefix} {r.prompt}", r.prompt_len + prefix_len, r.output_len, r.tag,
                     r.arrival_time)
        for r in requests
    ]


_JSONL_FIELDS = {
    "prompt",
    "prompt_len",
    "output_len",
    "arrival_time",
    "tag",
    "priority",
    "request_id",
}


def load_jsonl(
    path: str | Path,
    maker: PromptMaker,
    default_output_len: int = 128,
    max_model_len: int | None = None,
    limit: int | None = None,
) -> list[BenchRequest]:
    """Read a JSONL workload (module doc); ``prompt_len`` lines get a made-up prompt.

    Args:
        path: the file; blank lines and lines starting with ``#`` are skipped.
        maker: builds prompts for ``prompt_len`` lines.
        default_output_len: tokens for lines without ``output_len``.
        max_model_len: fit ``prompt_len`` lines into this context (tokens).
        limit: read at most this many requests.
    Raises:
        ValueError: unreadable file, bad JSON, an unknown field, or a missing or
            out-of-range value; the message names the line.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    out: list[BenchRequest] = []
    for lineno, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(_jsonl_request(json.loads(line), maker, default_output_len, max_model_len))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if not out:
        raise ValueError(f"{path} has no requests")
    return out


def _jsonl_request(
    d: Any, maker: PromptMaker, default_output_len: int, max_model_len: int | None
) -> BenchRequest:
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    unknown = set(d) - _JSONL_FIELDS
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    o = d.get("output_len", default_output_len)
    if not isinstance(o, int) or isinstance(o, bool) or o < 1:
        raise ValueError(f"output_len must be an integer >= 1, got {o!r}")
    t = d.get("arrival_time")
    if t is not None and (not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0):
        raise ValueError(f"arrival_time must be a number >= 0 (seconds), got {t!r}")
    tag = d.get("tag")
    if isinstance(d.get("prompt"), str) and d["prompt"]:
        return BenchRequest(d["prompt"], maker.count(d["prompt"]), o, tag, t)
    p = d.get("prompt_len")
    if not isinstance(p, int) or isinstance(p, bool) or p < 1:
        raise ValueError("need a non-empty 'prompt' string or 'prompt_len' >= 1")
    p, o = fit_context(p, o, max_model_len)
    return BenchRequest(maker.make(p), p, o, tag, t)


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times of ``n`` requests in seconds from the start (the first at 0).

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1 / rate``
    (as in vLLM's benchmark_serving): ``burstiness == 1`` is a Poisson process
    (exponential gaps), ``< 1`` is burstier (coefficient of variation
    ``1 / sqrt(burstiness)``), ``> 1`` more regular. ``rate == inf`` sends all at 0.

    Args:
        n: number of requests (>= 0).
        rate: mean requests per second (> 0, may be ``inf``).
        burstiness: gamma shape (> 0).
        seed: RNG seed.
    Raises:
        ValueError: an argument out of range.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 req/s (or inf), got {rate}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])
