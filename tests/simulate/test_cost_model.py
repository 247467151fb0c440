"""The cost model: work classification, step time, JSON round trip, least-squares fit."""

from __future__ import annotations

import numpy as np
import pytest

from paternoster.simulate import CostModel, StepWork


def test_step_work_classifies_rows():
    # a decode row (c=10, prompt 8), a prefill chunk (c=0..3 of a 10-token prompt),
    # a 1-token chunk of a prompt (c=5 < prompt 9): prefill
    w = StepWork.from_arrays(np.array([10, 0, 5]), np.array([1, 4, 1]), np.array([8, 10, 9]))
    assert (w.prefill_tokens, w.decode_tokens, w.num_seqs) == (5, 1, 3)
    assert (w.decode_kv_tokens, w.prefill_kv_tokens) == (11, 10 + 6)
    assert w.kv_tokens == 27


def test_four_term_model_charges_every_key_at_a_kv():
    w = StepWork(100, 10, 1000, 5000, 11)
    four = CostModel(0.01, 1e-4, 1e-3, 1e-6)
    assert four.step_time(w) == pytest.approx(0.01 + 1e-2 + 1e-2 + 6000e-6)
    five = CostModel(0.01, 1e-4, 1e-3, 1e-6, a_kv_prefill=1e-7)
    assert five.step_time(w) == pytest.approx(0.01 + 1e-2 + 1e-2 + 1000e-6 + 5000e-7)


def test_unit_cost_is_one_per_step():
    assert CostModel.unit().step_time(StepWork(500, 30, 10_000, 20_000, 31)) == 1.0


def test_json_round_trip(tmp_path):
    cm = CostModel(0.05, 4e-4, 1.5e-3, 2e-9, 5e-10, source="test")
    cm.save(tmp_path / "cm.json")
    assert CostModel.load(tmp_path / "cm.json") == cm


def test_bad_coefficients_and_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="a_decode"):
        CostModel(0.1, 0.0, -1.0, 0.0)
    (tmp_path / "bad.json").write_text('{"overhead": 1}')
    with pytest.raises(ValueError, match="missing"):
        CostModel.load(tmp_path / "bad.json")


def test_fit_recovers_known_coefficients():
    true = CostModel(0.05, 4e-4, 1.5e-3, 3e-6, 5e-7)
    rng = np.random.default_rng(0)
    works = [
        StepWork(int(p), int(d), int(dk), int(pk), 1)
        for p, d, dk, pk in zip(rng.integers(0, 2000, 30), rng.integers(0, 64, 30),
                                rng.integers(0, 100_000, 30), rng.integers(0, 2_000_000, 30))
    ]  # fmt: skip
    fitted, r2 = CostModel.fit(works, [true.step_time(w) for w in works])
    assert r2 > 0.9999
    for name in ("overhead", "a_prefill", "a_decode", "a_kv", "a_kv_prefill"):
        assert getattr(fitted, name) == pytest.approx(getattr(true, name), rel=1e-6)


def test_fit_keeps_coefficients_non_negative():
    works = [StepWork(p, 0, 0, 0, 1) for p in (0, 10, 20, 30, 40)]
    seconds = [1.0, 0.9, 0.8, 0.7, 0.6]  # time falls with tokens: the slope is clamped to 0
    fitted, _ = CostModel.fit(works, seconds)
    assert fitted.a_prefill == 0.0 and fitted.overhead > 0


def test_four_term_fit_leaves_a_kv_prefill_unset():
    true = CostModel(0.02, 3e-4, 6e-4, 1e-6)
    works = [StepWork(p, d, dk, pk, 1) for p, d, dk, pk in
             [(0, 1, 100, 0), (512, 0, 0, 131_328), (0, 32, 16_000, 0), (256, 16, 4000, 295_040),
              (1024, 0, 0, 524_800), (0, 8, 24_000, 0)]]  # fmt: skip
    fitted, r2 = CostModel.fit(works, [true.step_time(w) for w in works], split_kv=False)
    assert fitted.a_kv_prefill is None and r2 > 0.9999
    assert fitted.a_kv == pytest.approx(1e-6, rel=1e-6)


def test_step_noise_pools_run_scatter_and_fit_error():
    import math

    from paternoster.scheduling.cost_model import StepWork
    from paternoster.simulate.calibrate import CalibrationSample, step_noise

    work = StepWork.from_arrays(np.array([0]), np.array([8]), np.array([8]))
    # Runs 1 and e^0.2 s (log scatter: 0.01 each side, 1 degree of freedom),
    # and a probe the model predicts exactly; no misfit.
    a = CalibrationSample("a", work, math.exp(0.1), math.exp(0.1), (1.0, math.exp(0.2)))
    b = CalibrationSample("b", work, 2.0, 2.0, (2.0, 2.0, 2.0))
    assert step_noise([a, b]) == pytest.approx(math.sqrt(0.02 / 3))
    # A 10 % misfit on one of the two probes adds mean(log(1.1)^2, 0) in variance.
    c = CalibrationSample("c", work, 2.2, 2.0, (2.2, 2.2))
    expected = math.sqrt(0.02 / 2 + math.log(1.1) ** 2 / 2)
    assert step_noise([a, c]) == pytest.approx(expected)
    with pytest.raises(ValueError, match="two runs"):
        step_noise([CalibrationSample("d", work, 1.0, 1.0, (1.0,))])


def test_step_noise_round_trips_and_is_checked(tmp_path):
    cm = CostModel(0.05, 4e-4, 1.5e-3, 2e-9, 5e-10, source="test", step_noise=0.12)
    cm.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json") == cm
    assert CostModel.from_dict({"overhead": 0.1, "a_prefill": 0, "a_decode": 0,
                                "a_kv": 0}).step_noise == 0.0  # fmt: skip
    with pytest.raises(ValueError, match="step_noise"):
        CostModel(0.1, 0.0, 0.0, 0.0, step_noise=-0.1)


def row_law(num_tokens: int) -> float:
    """An independent step-time law with a concave row cost, as the CPU's:
    10 ms, 1.75 ms a row up to 24 rows (the core kernel), 0.6 ms a row above
    (the GEMM): seconds."""
    return 0.010 + 1.75e-3 * min(num_tokens, 24) + 0.6e-3 * max(num_tokens - 24, 0)


def test_first_tokens_term_charges_a_steps_first_tokens():
    w = StepWork(prefill_tokens=30, decode_tokens=10, decode_kv_tokens=0,
                 prefill_kv_tokens=0, num_seqs=11)  # fmt: skip
    cm = CostModel(0.01, 1e-3, 2e-3, 0.0, 0.0, a_first_tokens=5e-4, first_tokens=24)
    assert cm.step_time(w) == pytest.approx(0.01 + 30e-3 + 20e-3 + 24 * 5e-4)
    with pytest.raises(ValueError, match="first_tokens"):
        CostModel(0.01, 1e-3, 2e-3, 0.0, first_tokens=-1)


def test_fit_finds_the_knee_of_a_concave_row_cost():
    """Decode batches and small and large chunks beside decodes, timed by
    :func:`row_law`: the five-term model mispredicts the small chunks (its
    per-token prefill cost is the GEMM's), the fit with knees recovers the
    law (knee 24, 1.15 ms more for each of the first 24 rows)."""
    shapes = [(0, d) for d in (1, 4, 8, 16, 24, 32, 64, 128)]
    shapes += [(p, d) for p in (8, 16, 64, 256, 1024) for d in (0, 4, 16)]
    works = [StepWork(p, d, 0, 0, d + 1) for p, d in shapes]
    seconds = [row_law(p + d) for p, d in shapes]
    five, _ = CostModel.fit(works, seconds)
    small = StepWork(16, 4, 0, 0, 5)
    assert abs(five.step_time(small) / row_law(20) - 1) > 0.1
    fitted, r2 = CostModel.fit(works, seconds, first_tokens=(0, 8, 16, 24, 32, 64))
    assert fitted.first_tokens == 24 and r2 > 0.9999
    assert fitted.a_first_tokens == pytest.approx(1.15e-3, rel=1e-6)
    for p, d in [(5, 3), (100, 20), (2000, 0), (0, 50)]:
        assert fitted.step_time(StepWork(p, d, 0, 0, d + 1)) == pytest.approx(row_law(p + d))


def test_first_tokens_round_trips_and_an_old_file_has_none(tmp_path):
    cm = CostModel(0.05, 4e-4, 1.5e-3, 2e-9, 5e-10, a_first_tokens=1e-3, first_tokens=24)
    cm.save(tmp_path / "cm.json")
    assert CostModel.load(tmp_path / "cm.json") == cm
    old = CostModel.from_dict({"overhead": 0.05, "a_prefill": 4e-4, "a_decode": 1e-3,
                               "a_kv": 0.0})  # fmt: skip
    assert (old.a_first_tokens, old.first_tokens) == (0.0, 0)


def test_a_misspelt_key_a_knee_without_a_count_and_numpy_ints():
    """A typo would silently leave a term out: refused, naming it; a first-tokens
    cost with no count of tokens is refused; numpy integers are integers."""
    with pytest.raises(ValueError, match=r"unknown keys \['first_token'\]"):
        CostModel.from_dict({"overhead": 0.05, "a_prefill": 4e-4, "a_decode": 1e-3,
                             "a_kv": 0.0, "first_token": 24})  # fmt: skip
    with pytest.raises(ValueError, match="needs first_tokens > 0"):
        CostModel(0.01, 1e-3, 2e-3, 0.0, a_first_tokens=1e-3)
    for bad in (24.5, 24.0, "24", True):
        with pytest.raises(ValueError, match="first_tokens must be an integer"):
            CostModel(0.01, 1e-3, 2e-3, 0.0, a_first_tokens=1e-3, first_tokens=bad)
    cm = CostModel(0.01, 1e-3, 2e-3, 0.0, a_first_tokens=1e-3, first_tokens=np.int64(24))
    assert type(cm.first_tokens) is int and cm.first_tokens == 24
    shapes = [(0, d) for d in (1, 4, 16, 24, 64)] + [(p, 4) for p in (8, 64, 256)]
    works = [StepWork(p, d, 0, 0, d + 1) for p, d in shapes]
    fitted, _ = CostModel.fit(works, [row_law(p + d) for p, d in shapes],
                              first_tokens=np.arange(8, 33, 8))  # fmt: skip
    assert fitted.first_tokens == 24
