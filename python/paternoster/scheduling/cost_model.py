"""Step-time cost model: a linear function of what a step computes.

Used by the simulator (docs/simulator.md) to time steps and by the ``slo``
scheduler to plan them (docs/schedulers.md); it lives in ``scheduling`` so that
both layers can import it.

``t = overhead + a_prefill * prefill_tokens + a_decode * decode_tokens
+ a_kv * decode_kv_tokens + a_kv_prefill * prefill_kv_tokens`` seconds. The
per-step overhead covers what does not grow with the batch (reading the
weights once per forward on a memory-bound CPU, launch and Python costs); the
per-token terms cover the linear layers (a decode row also pays the LM head,
which a prefill chunk pays only once); the KV terms cover attention, whose work
grows with the keys each query token attends to. Decode and prefill attention
get separate coefficients because their kernels differ: a decode query reads
every cached K/V row for itself (memory bound), while a prefill chunk's queries
share each K/V tile (compute bound), so one attended key costs a decode several
times what it costs a prefill token. With ``a_kv_prefill`` unset both use
``a_kv``: the four-term model ``overhead + a_prefill * prefill_tokens +
a_decode * decode_tokens + a_kv * kv_tokens``. The shape follows the cost
models of Orca (Yu et al., OSDI'22) and Sarathi-Serve (Agrawal et al.,
OSDI'24): a fixed part, per-token parts and an attention part.

An optional sixth term, ``a_first_tokens * min(num_tokens, first_tokens)``,
charges each of a step's first ``first_tokens`` query tokens (decode and
prefill alike) ``a_first_tokens`` more: the cost of a row of the linear
layers depends on how many rows the step has. On the CPU the core's kernel
takes the linear layers up to ``kernels.cpu.DENSE_CORE_MAX_TOKENS`` rows and
torch's GEMM above, which multiplies a row several times cheaper on a CPU
with AMX (1.75 ms against 0.6 ms per row, docs/benchmarks.md); without the
term a small prompt chunk beside the decodes costs 1.5-1.6x what the model
says. Both coefficients stay >= 0, so the term bends the step time down
after the knee (a concave cost, as on a CPU), never up.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

#: The knees :meth:`CostModel.fit` tries for the first-tokens term when asked
#: to choose (0: no such term), in tokens: around the CPU kernel crossovers
#: (8, 24, 128) and GPU tile sizes.
FIRST_TOKENS_KNEES = (0, 8, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class StepWork:
    """What one step computes: the cost model's inputs.

    Attributes:
        prefill_tokens: query tokens of rows that (re)compute prompt or, after a
            preemption, already generated tokens (tokens).
        decode_tokens: query tokens of decode rows: one new token of a request
            whose prompt is already in the KV cache (tokens).
        decode_kv_tokens: keys attended by the decode tokens (each attends its
            whole context, ``c + 1`` keys) (tokens).
        prefill_kv_tokens: keys attended by the prefill tokens, summed over
            query tokens: a row with ``c`` cached tokens computing ``n`` new
            ones attends ``n * c + n * (n + 1) / 2`` keys (tokens).
        num_seqs: rows in the batch (requests).
    """

    prefill_tokens: int
    decode_tokens: int
    decode_kv_tokens: int
    prefill_kv_tokens: int
    num_seqs: int

    @property
    def num_tokens(self) -> int:
        """Query tokens of the step, prompt and decode (rows of the linear layers)."""
        return self.prefill_tokens + self.decode_tokens

    @property
    def kv_tokens(self) -> int:
        """Keys attended, summed over every query token of the step (tokens)."""
        return self.decode_kv_tokens + self.prefill_kv_tokens

    @classmethod
    def from_arrays(
        cls, num_computed: np.ndarray, num_scheduled: np.ndarray, num_prompt: np.ndarray
    ) -> StepWork:
        """Classify a step's rows.

        Args:
            num_computed: int ``[B]``, tokens already in the KV cache per row.
            num_scheduled: int ``[B]``, tokens computed this step per row (>= 1).
            num_prompt: int ``[B]``, prompt length per row.
        Returns:
            The step's work; a row is a decode row when it computes one token
            and its prompt is already cached (``n == 1 and c >= prompt``).
        """
        c = np.asarray(num_computed, dtype=np.int64)
        n = np.asarray(num_scheduled, dtype=np.int64)
        decode = (n == 1) & (c >= np.asarray(num_prompt, dtype=np.int64))
        kv = n * c + n * (n + 1) // 2
        num_decode = int(np.count_nonzero(decode))
        decode_kv = int(kv[decode].sum())
        return cls(
            prefill_tokens=int(n.sum()) - num_decode,
            decode_tokens=num_decode,
            decode_kv_tokens=decode_kv,
            prefill_kv_tokens=int(kv.sum()) - decode_kv,
            num_seqs=len(n),
        )

    def features(self, first_tokens: int = 0) -> list[float]:
        """``[1, prefill_tokens, decode_tokens, decode_kv_tokens, prefill_kv_tokens,
        min(num_tokens, first_tokens)]``, the regression row."""
        return [
            1.0,
            float(self.prefill_tokens),
            float(self.decode_tokens),
            float(self.decode_kv_tokens),
            float(self.prefill_kv_tokens),
            float(min(self.num_tokens, first_tokens)),
        ]


@dataclass(frozen=True)
class CostModel:
    """Step time in seconds as a linear function of :class:`StepWork`.

    Attributes:
        overhead: seconds per step, whatever it computes.
        a_prefill: seconds per prefill (or recompute) token.
        a_decode: seconds per decode token.
        a_kv: seconds per key attended by a decode token (and by a prefill
            token too when ``a_kv_prefill`` is ``None``).
        a_kv_prefill: seconds per key attended by a prefill token, or ``None``
            (the four-term model: ``a_kv`` for every attended key).
        a_first_tokens: seconds more for each of a step's first
            ``first_tokens`` query tokens (module docstring; 0: no such term).
        first_tokens: how many of a step's tokens pay ``a_first_tokens``
            (tokens; the knee).
        source: free text: where the coefficients come from.
        step_noise: how much measured step times scatter around the model:
            the standard deviation of ``log(measured / modelled)`` (0: none).
            The simulator draws each step's time as ``step_time(work) *
            exp(step_noise * z)``, ``z`` standard normal (seeded).
    Raises:
        ValueError: a negative or non-finite coefficient (the message names it).
    """

    overhead: float
    a_prefill: float
    a_decode: float
    a_kv: float
    a_kv_prefill: float | None = None
    source: str = ""
    step_noise: float = 0.0
    a_first_tokens: float = 0.0
    first_tokens: int = 0

    def __post_init__(self) -> None:
        knee = self.first_tokens
        try:
            ok = not isinstance(knee, bool) and operator.index(knee) >= 0
        except TypeError:  # a float, a string: not an integer
            ok = False
        if not ok:
            raise ValueError(f"cost model first_tokens must be an integer >= 0, got {knee!r}")
        object.__setattr__(self, "first_tokens", operator.index(knee))  # numpy ints too
        for name in ("overhead", "a_prefill", "a_decode", "a_kv", "a_kv_prefill", "step_noise",
                     "a_first_tokens"):
            value = getattr(self, name)
            if value is None and name == "a_kv_prefill":
                continue
            if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ValueError(f"cost model {name} must be a finite number >= 0, got {value!r}")
        if self.a_first_tokens > 0 and self.first_tokens == 0:
            raise ValueError("cost model a_first_tokens > 0 needs first_tokens > 0 (how many of "
                             "a step's tokens pay it)")

    @classmethod
    def unit(cls) -> CostModel:
        """Every step costs exactly 1 time unit (time then counts steps)."""
        return cls(1.0, 0.0, 0.0, 0.0, source="unit: one time unit per step")

    @property
    def per_key_prefill(self) -> float:
        """Seconds per key attended by a prefill token (``a_kv_prefill`` or ``a_kv``)."""
        return self.a_kv if self.a_kv_prefill is None else self.a_kv_prefill

    def step_time(self, work: StepWork) -> float:
        """Seconds one step with this work takes."""
        return (
            self.overhead
            + self.a_prefill * work.prefill_tokens
            + self.a_decode * work.decode_tokens
            + self.a_kv * work.decode_kv_tokens
            + self.per_key_prefill * work.prefill_kv_tokens
            + self.a_first_tokens * min(work.num_tokens, self.first_tokens)
        )

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CostModel:
        """Build from a dict with keys ``overhead``, ``a_prefill``, ``a_decode``,
        ``a_kv`` (and optionally ``a_kv_prefill``, ``source``,
        ``step_noise``, ``a_first_tokens`` and ``first_tokens``).

        Raises:
            ValueError: a key is missing or unknown, or a value is out of range.
        """
        missing = [k for k in ("overhead", "a_prefill", "a_decode", "a_kv") if k not in d]
        if missing:
            raise ValueError(f"cost model is missing {missing}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:  # a misspelt term would silently be left out
            raise ValueError(f"cost model has unknown keys {unknown}; the keys are "
                             f"{[f.name for f in fields(cls)]}")
        return cls(
            overhead=d["overhead"],
            a_prefill=d["a_prefill"],
            a_decode=d["a_decode"],
            a_kv=d["a_kv"],
            a_kv_prefill=d.get("a_kv_prefill"),
            source=str(d.get("source", "")),
            step_noise=d.get("step_noise", 0.0),
            a_first_tokens=d.get("a_first_tokens", 0.0),
            first_tokens=d.get("first_tokens", 0),
        )

    def save(self, path: str | Path) -> None:
        """Write the model as a JSON object to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a model written by :meth:`save`.

        Raises:
            ValueError: unreadable file, malformed JSON or bad fields.
        """
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read cost model {path}: {e}") from None
        if not isinstance(d, dict):
            raise ValueError(f"cost model {path} is not a JSON object")
        return cls.from_dict(d)

    # ------------------------------------------------------------------ fit

    @classmethod
    def fit(
        cls, works: list[StepWork], seconds: list[float], source: str = "",
        split_kv: bool = True, first_tokens: int | Sequence[int] = 0,
    ) -> tuple[CostModel, float]:  # fmt: skip
        """Least-squares fit of the coefficients to measured step times.

        Minimises the *relative* error (each row weighted by ``1 / seconds``), so
        that 50 ms decode steps count as much as 1 s prefills, under the
        constraint that every coefficient is >= 0 (a coefficient the
        unconstrained fit makes negative is fixed at 0 and the rest refitted).

        Args:
            works: the measured steps (at least 5, varied enough to separate terms).
            seconds: their measured durations (> 0), same order.
            source: stored in the returned model's ``source``.
            split_kv: fit ``a_kv`` and ``a_kv_prefill`` apart (five terms);
                ``False`` fits one ``a_kv`` for every attended key (four terms,
                ``a_kv_prefill`` left ``None``).
            first_tokens: the knee of the first-tokens term (module
                docstring): 0 leaves the term out; a sequence of knees fits
                each and keeps the one with the least relative error (the
                steps must then include some of fewer tokens than the knee).
        Returns:
            ``(model, r2)``: the fit and its coefficient of determination on
            ``seconds`` (unweighted).
        Raises:
            ValueError: fewer than 5 samples, lengths differ, a time <= 0, or
                a negative knee.
        """
        if len(works) != len(seconds) or len(works) < 5:
            raise ValueError("fit needs at least 5 (work, seconds) pairs of equal count")
        y = np.asarray(seconds, dtype=np.float64)
        if np.any(y <= 0):
            raise ValueError("measured step times must be > 0")
        knees = [first_tokens] if np.ndim(first_tokens) == 0 else list(first_tokens)
        if not knees or any(k < 0 for k in knees):
            raise ValueError(f"first_tokens must be >= 0 (or a non-empty list of such), "
                             f"got {first_tokens!r}")
        best: tuple[float, int, np.ndarray] | None = None
        for knee in knees:
            x = np.asarray([w.features(knee) for w in works], dtype=np.float64)
            if not split_kv:
                x = np.column_stack([x[:, :3], x[:, 3] + x[:, 4], x[:, 5]])
            coef = _nonnegative_relative_lstsq(x, y)
            err = float(np.sum((1.0 - x @ coef / y) ** 2))
            if best is None or err < best[0]:
                best = (err, knee, coef)
        _, knee, coef = best
        a_first = float(coef[-1])
        head = [float(v) for v in coef[:-1]]  # a_kv_prefill None if 4 terms
        model = cls(*head, source=source, a_first_tokens=a_first,
                    first_tokens=knee if a_first > 0 else 0)
        pred = np.array([model.step_time(w) for w in works])
        ss_tot = float(np.sum((y - y.mean()) ** 2))
        r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
        return model, r2


def _nonnegative_relative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients ``c >= 0`` minimising ``sum(((x @ c - y) / y) ** 2)``: least
    squares on the active set, the most negative coefficient dropped until
    none is (``x``: ``[N, K]`` float64, ``y``: ``[N]`` > 0; returns ``[K]``)."""
    xw, yw = x / y[:, None], np.ones_like(y)
    active = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(xw[:, active], yw, rcond=None)
        if np.all(sol >= 0):
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


#: Calibrated on the project's 2-core CPU (SmolLM2-135M-Instruct, bf16, one
#: thread, block size 16; R^2 = 0.998 over 19 probes) with
#: ``paternoster simulate --calibrate``; see docs/benchmarks.md. The simulator's
#: default.
DEFAULT_COST_MODEL = CostModel(
    overhead=46.28e-3,
    a_prefill=332.9e-6,
    a_decode=696.1e-6,
    a_kv=2.911e-6,
    a_kv_prefill=0.5803e-6,
    source="calibrated: SmolLM2-135M-Instruct, bf16, 1 thread, block size 16, 2-core CPU",
)
