"""A step-time predictor that starts from a calibrated cost model and learns online.

The cost model (:class:`~paternoster.scheduling.cost_model.CostModel`) says a
step takes ``overhead + a_prefill * P + a_decode * D + a_kv * K_decode +
a_kv_prefill * K_prefill + a_first_tokens * min(P + D, first_tokens)``
seconds. The machine a policy runs on is rarely
the one the model was calibrated on (other threads, another CPU, a GPU, a
neighbour's load), so :class:`StepTimePredictor` keeps one multiplier per
term and fits them to the measured step times by exponentially weighted
least squares with a ridge towards one common factor ``g``::

    minimise  sum_s lambda^(t - s) * ((y_s - m . x_s) / y_s)^2  +  rho * |m - g|^2

where ``x_s`` are step ``s``'s six terms under the calibrated model (seconds),
``y_s`` its measured time, ``lambda = 1 - 1 / window`` forgets old steps
(recursive least squares with forgetting, Ljung & Soderstrom 1983), ``rho``
is the prior's weight in steps and ``g`` is the best single factor on the
same data (the calibrated model scaled as a whole). Errors are relative, as
in the calibration fit. A machine uniformly slower or faster is learnt
exactly; a term the recent steps did not exercise follows the common factor.
The effective coefficients are the calibrated ones times the multipliers;
the policy plans with them.

The fit follows the mean; the spread around it (other processes sharing the
cores, memory traffic) is kept too: :attr:`StepTimePredictor.spread` is the
95th percentile of measured / predicted over the last ``window`` steps
(predicted just before each measurement; 1 until 20 steps are in), by which
a policy can divide a time target so that 19 steps in 20 fit it.

In the simulator the measured time *is* the cost model's, so the multipliers
stay at 1 and the prediction equals the simulator's step time exactly.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import numpy as np

from paternoster.scheduling.cost_model import CostModel, StepWork

#: Lower and upper bound of a multiplier: a measurement glitch (a GC pause, a
#: noisy neighbour) can move the fit, never to absurd coefficients.
MULTIPLIER_RANGE = (0.1, 10.0)
#: Measured / predicted ratios needed before :attr:`StepTimePredictor.spread` moves.
MIN_SPREAD_SAMPLES = 20
#: The percentile of measured / predicted that ``spread`` reports.
SPREAD_PERCENTILE = 95


class StepTimePredictor:
    """Predicts step times from a :class:`CostModel`, corrected online.

    Args:
        cost_model: the calibrated model (the starting point and the prior).
        window: steps of memory of the online fit (forgetting factor
            ``1 - 1 / window``); > 1.
        prior_weight: weight of the calibrated model, in steps (> 0).
        adapt: learn from :meth:`observe`; ``False`` keeps the calibrated model.
    Raises:
        ValueError: ``window <= 1`` or ``prior_weight <= 0``.
    """

    def __init__(self, cost_model: CostModel, window: float = 100.0,
                 prior_weight: float = 0.1, adapt: bool = True) -> None:  # fmt: skip
        if not window > 1:
            raise ValueError(f"window must be > 1 steps, got {window!r}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        self.cost_model = cost_model
        self.adapt = adapt
        self.forget = 1.0 - 1.0 / window
        self.prior_weight = prior_weight
        self._base = np.array([cost_model.overhead, cost_model.a_prefill, cost_model.a_decode,
                               cost_model.a_kv, cost_model.per_key_prefill,
                               cost_model.a_first_tokens])  # fmt: skip
        #: The knee of the first-tokens term (tokens; the cost model's).
        self.first_tokens = cost_model.first_tokens
        self._a = np.zeros((6, 6))
        self._b = np.zeros(6)
        self.multipliers = np.ones(6)
        self.num_observed = 0
        #: 95th percentile of measured / predicted step time, recent steps (>= 1).
        self.spread = 1.0
        self._ratios: deque[float] = deque(maxlen=int(window))
        self._set_coefficients()

    def _set_coefficients(self) -> None:
        """Cache the effective coefficients as Python floats (planning is scalar)."""
        c = self._base * self.multipliers
        (self.overhead, self.a_prefill, self.a_decode, self.a_kv, self.a_kv_prefill,
         self.a_first_tokens) = map(float, c)  # fmt: skip

    def terms(self, work: StepWork) -> np.ndarray:
        """The calibrated model's six terms for ``work`` (seconds each; their
        sum is ``cost_model.step_time(work)``)."""
        return self._base * np.asarray(work.features(self.first_tokens))

    def predict(self, work: StepWork) -> float:
        """Predicted seconds of a step doing ``work``."""
        return (self.overhead + self.a_prefill * work.prefill_tokens
                + self.a_decode * work.decode_tokens + self.a_kv * work.decode_kv_tokens
                + self.a_kv_prefill * work.prefill_kv_tokens
                + self.a_first_tokens * min(work.num_tokens, self.first_tokens))  # fmt: skip

    def observe(self, work: StepWork, seconds: float) -> None:
        """Fold one measured step into the fit (nothing when ``adapt`` is off,
        or ``seconds`` is not a finite number > 0)."""
        if not self.adapt or not (0 < seconds < math.inf):
            return
        predicted = self.predict(work)
        if predicted > 0:
            self._ratios.append(seconds / predicted)
            if len(self._ratios) >= MIN_SPREAD_SAMPLES:
                self.spread = max(1.0, float(np.percentile(self._ratios, SPREAD_PERCENTILE)))
        x = self.terms(work) / seconds
        self._a = self.forget * self._a + np.outer(x, x)
        self._b = self.forget * self._b + x
        rho = self.prior_weight
        g = self._b.sum() / self._a.sum()  # the best common factor: ones . b / ones . A . ones
        m = np.linalg.solve(self._a + rho * np.eye(6), self._b + rho * g)
        self.multipliers = np.clip(m, *MULTIPLIER_RANGE)
        self.num_observed += 1
        self._set_coefficients()

    # ------------------------------------------------------------ planning

    def decode_time(self, num_decodes: int, decode_kv_tokens: int) -> float:
        """Seconds of a step with only ``num_decodes`` decode rows attending
        ``decode_kv_tokens`` keys in all (the overhead included)."""
        return (self.overhead + self.a_decode * num_decodes + self.a_kv * decode_kv_tokens
                + self.a_first_tokens * min(num_decodes, self.first_tokens))  # fmt: skip

    def chunk_time(self, num_tokens: int, num_cached: int, rows_before: int = 0) -> float:
        """Marginal seconds of a prefill chunk of ``num_tokens`` after
        ``num_cached`` cached tokens (no overhead: it shares a step) in a
        step that already has ``rows_before`` query tokens (decodes and
        other chunks: the first-tokens term charges the chunk only for the
        first ``first_tokens`` of the step that it takes up)."""
        n = num_tokens
        keys = n * num_cached + n * (n + 1) // 2
        first = min(rows_before + n, self.first_tokens) - min(rows_before, self.first_tokens)
        return self.a_prefill * n + self.a_kv_prefill * keys + self.a_first_tokens * first

    def chunk_fitting(self, seconds: float, num_cached: int, rows_before: int = 0) -> int:
        """The largest chunk whose :meth:`chunk_time` (``rows_before`` as
        there) is at most ``seconds`` (0 when even one token does not fit)."""
        if seconds <= 0:
            return 0
        a = self.a_kv_prefill / 2
        b = self.a_prefill + self.a_kv_prefill * (num_cached + 0.5)
        if a > 0:
            n = int((-b + math.sqrt(b * b + 4 * a * seconds)) / (2 * a))
        else:
            n = int(seconds / b) if b > 0 else 1 << 30
        # the first-tokens term only lowers it: the chunks 1..n that fit are a prefix
        return bisect.bisect_left(range(1, n + 1), True,
                                  key=lambda k: self.chunk_time(k, num_cached, rows_before)
                                  > seconds)  # fmt: skip
