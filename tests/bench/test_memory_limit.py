"""bench/memory_limit.py: interleaved step / bandwidth pairs."""

import time

import pytest

from paternoster.bench.memory_limit import BandwidthProbe, PairedRound, paired_rounds, summarize


def test_rounds_alternate_steps_with_samples_and_ratios_follow_the_definition():
    probe = BandwidthProbe(size_mb=4)
    calls = []

    def step():
        calls.append("step")
        time.sleep(0.002)

    pairs = paired_rounds(step, lambda: 1e6 * (1 + len(calls)), probe, rounds=3,
                          steps_per_round=4)
    assert len(calls) == 12 and len(pairs) == 3
    # bytes_per_step is read before each round's steps: 0, 4 and 8 steps done
    assert [p.bytes_per_step for p in pairs] == [1e6, 5e6, 9e6]
    for p in pairs:
        assert 0.002 <= p.step_s < 0.5 and p.read_bps > 0 and p.copy_bps > 0
        # step / (bytes / bandwidth), computed here from the definition
        assert p.ratio("read") == pytest.approx(p.step_s * p.read_bps / p.bytes_per_step)
        assert p.ratio("copy") == pytest.approx(p.step_s * p.copy_bps / p.bytes_per_step)
    text = summarize(pairs)
    assert "paired rounds: 3" in text and "copy bandwidth" in text


def test_the_median_ratio_and_its_range_are_reported():
    pairs = [PairedRound(0.010, 50e9, 40e9, 250e6), PairedRound(0.012, 40e9, 40e9, 250e6),
             PairedRound(0.008, 30e9, 40e9, 250e6)]
    # read ratios: 2.0, 1.92, 0.96 -> median 1.92; copy: 1.6, 1.92, 1.28
    text = summarize(pairs)
    assert "median 1.92x (range 0.96-2.00x)" in text
    assert "median 1.60x (range 1.28-1.92x)" in text


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="size_mb"):
        BandwidthProbe(size_mb=0)
    with pytest.raises(ValueError, match="rounds"):
        paired_rounds(lambda: None, lambda: 1.0, BandwidthProbe(1), rounds=0)
