"""StepTimePredictor against the cost model it starts from (an independent
reference: CostModel.step_time) and against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from paternoster.scheduling.cost_model import DEFAULT_COST_MODEL, CostModel, StepWork
from paternoster.scheduling.step_time import StepTimePredictor


def random_works(n: int, seed: int = 0) -> list[StepWork]:
    """Steps of varied shape: decode batches, chunks after cached context, mixes."""
    rng = np.random.default_rng(seed)
    works = []
    for _ in range(n):
        rows = int(rng.integers(1, 20))
        computed = rng.integers(0, 3000, rows)
        prefill = rng.random(rows) < 0.3
        scheduled = np.where(prefill, rng.integers(2, 600, rows), 1)
        prompt = np.where(prefill, computed + scheduled, computed)
        works.append(StepWork.from_arrays(computed, scheduled, prompt))
    return works


def test_prediction_equals_the_cost_model_before_and_after_exact_measurements():
    pred = StepTimePredictor(DEFAULT_COST_MODEL)
    works = random_works(200)
    for w in works:
        assert pred.predict(w) == pytest.approx(DEFAULT_COST_MODEL.step_time(w), rel=1e-12)
    for w in works:  # the simulator's case: measured = the cost model
        pred.observe(w, DEFAULT_COST_MODEL.step_time(w))
    np.testing.assert_allclose(pred.multipliers, 1.0, atol=1e-9)
    for w in random_works(50, seed=1):
        assert pred.predict(w) == pytest.approx(DEFAULT_COST_MODEL.step_time(w), rel=1e-9)


def test_online_fit_learns_a_slower_machine():
    """Measured steps 1.7x the calibration (another CPU, more load): within a
    few windows the prediction follows the measurements."""
    pred = StepTimePredictor(DEFAULT_COST_MODEL, window=50)
    for w in random_works(400):
        pred.observe(w, 1.7 * DEFAULT_COST_MODEL.step_time(w))
    for w in random_works(50, seed=2):
        assert pred.predict(w) == pytest.approx(1.7 * DEFAULT_COST_MODEL.step_time(w), rel=0.02)


def test_online_fit_learns_per_term_errors():
    """A machine whose prefill is 2x slower and overhead 0.5x: the terms are
    told apart from varied steps."""
    truth = CostModel(DEFAULT_COST_MODEL.overhead * 0.5, DEFAULT_COST_MODEL.a_prefill * 2,
                      DEFAULT_COST_MODEL.a_decode, DEFAULT_COST_MODEL.a_kv,
                      DEFAULT_COST_MODEL.a_kv_prefill)  # fmt: skip
    pred = StepTimePredictor(DEFAULT_COST_MODEL)
    for w in random_works(1500):
        pred.observe(w, truth.step_time(w))
    errors = [abs(pred.predict(w) / truth.step_time(w) - 1) for w in random_works(100, seed=3)]
    assert max(errors) < 0.05
    assert pred.a_prefill == pytest.approx(truth.a_prefill, rel=0.1)


def test_adapt_off_and_bad_measurements_change_nothing():
    pred = StepTimePredictor(DEFAULT_COST_MODEL, adapt=False)
    w = random_works(1)[0]
    pred.observe(w, 10.0)
    on = StepTimePredictor(DEFAULT_COST_MODEL)
    on.observe(w, 0.0)
    on.observe(w, float("nan"))
    for p in (pred, on):
        assert p.predict(w) == pytest.approx(DEFAULT_COST_MODEL.step_time(w))


@pytest.mark.parametrize("cached", [0, 17, 1000, 5000])
@pytest.mark.parametrize("seconds", [0.0, 1e-5, 0.01, 0.137, 2.5])
def test_chunk_fitting_is_the_largest_chunk_within_the_time(cached, seconds):
    pred = StepTimePredictor(DEFAULT_COST_MODEL)
    n = pred.chunk_fitting(seconds, cached)
    times = [pred.chunk_time(k, cached) for k in range(0, 20000)]
    expected = max(k for k, t in enumerate(times) if t <= seconds)
    assert n == expected


def test_chunk_time_is_the_cost_model_of_the_chunk_without_overhead():
    """Adding a chunk of n tokens after c cached to a step adds exactly
    chunk_time(n, c) to the cost model's time of that step."""
    pred = StepTimePredictor(DEFAULT_COST_MODEL)
    base = StepWork.from_arrays(np.array([300, 40]), np.array([1, 1]), np.array([300, 40]))
    both = StepWork.from_arrays(np.array([300, 40, 700]), np.array([1, 1, 128]),
                                np.array([300, 40, 1000]))  # fmt: skip
    extra = DEFAULT_COST_MODEL.step_time(both) - DEFAULT_COST_MODEL.step_time(base)
    assert pred.chunk_time(128, 700) == pytest.approx(extra)
    assert pred.decode_time(2, 301 + 41) == pytest.approx(DEFAULT_COST_MODEL.step_time(base))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"window": 1}, "window"), ({"prior_weight": 0}, "prior_weight"),
])  # fmt: skip
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepTimePredictor(DEFAULT_COST_MODEL, **kwargs)


def test_spread_is_the_95th_percentile_of_measured_over_predicted():
    """Exact measurements: spread 1. One step in four 1.5x slower than the
    others (noise the mean cannot absorb): the 95th percentile of measured /
    predicted lies in the slow group, well above 1."""
    exact = StepTimePredictor(DEFAULT_COST_MODEL, adapt=True)
    for w in random_works(100):
        exact.observe(w, DEFAULT_COST_MODEL.step_time(w))
    assert exact.spread == pytest.approx(1.0)
    noisy = StepTimePredictor(DEFAULT_COST_MODEL)
    for i, w in enumerate(random_works(400)):
        noisy.observe(w, DEFAULT_COST_MODEL.step_time(w) * (1.5 if i % 4 == 0 else 1.0))
    # the fit settles between 1.0 and 1.5 (mean ~1.12), so the slow quarter
    # reads ~1.33 and the fast three quarters ~0.89
    assert 1.2 < noisy.spread < 1.5


KNEED = CostModel(0.01, 3e-4, 7e-4, 3e-6, 6e-7, a_first_tokens=1.2e-3, first_tokens=24)


@pytest.mark.parametrize("rows_before", [0, 5, 23, 24, 100])
@pytest.mark.parametrize("seconds", [0.0, 1e-3, 0.01, 0.05, 0.3])
def test_chunk_fitting_with_a_knee_is_the_largest_chunk_within_the_time(rows_before, seconds):
    """Brute force over chunk sizes, times from the cost model of the whole
    step (a step of ``rows_before`` decodes at 100 cached, then the chunk)."""
    pred = StepTimePredictor(KNEED)
    c = np.full(rows_before, 100)
    base = StepWork.from_arrays(c, np.ones(rows_before, int), c)
    def extra(k: int) -> float:
        w = StepWork.from_arrays(np.append(c, 300), np.append(np.ones(rows_before, int), k),
                                 np.append(c, 300 + k))  # fmt: skip
        return KNEED.step_time(w) - KNEED.step_time(base)
    expected = max(k for k in range(0, 2000) if k == 0 or extra(k) <= seconds + 1e-15)
    assert pred.chunk_fitting(seconds, 300, rows_before) == expected
    if expected:
        assert pred.chunk_time(expected, 300, rows_before) == pytest.approx(extra(expected))
    assert pred.decode_time(rows_before, 101 * rows_before) == pytest.approx(KNEED.step_time(base))
