"""bench/sustained.py: per-window p95s and the 'holds' verdict, worked out
by hand on small runs (no server)."""

from __future__ import annotations

import math
import time

import pytest

from paternoster.bench.capacity import Objectives
from paternoster.bench.memory_limit import BandwidthMonitor
from paternoster.bench.sustained import bandwidth_cell, parse_args, verdict, window_p95

OBJ = Objectives(ttft_p95=2.0, itl_p95=0.2)


def run(sent: list[float], ttft: float, gap: float, ok: bool = True) -> list[dict]:
    return [{"sent": s, "ttft": ttft, "itl": [gap, gap], "success": ok} for s in sent]


def test_window_takes_the_requests_sent_in_it():
    """TTFTs 0..9 s sent at 0..9: the window [0, 5) holds TTFTs 0-4, whose
    p95 (linear) is 4 x 0.95 = 3.8; every gap is 0.1 s."""
    reqs = [{"sent": float(i), "ttft": float(i), "itl": [0.1], "success": True}
            for i in range(10)]  # fmt: skip
    ttft, itl, n = window_p95(reqs, 0, 5)
    assert (n, itl) == (5, 0.1) and ttft == pytest.approx(3.8)


def test_a_thin_window_reports_nothing():
    ttft, itl, n = window_p95(run([0, 1, 2], 0.5, 0.1), 0, 10)
    assert n == 3 and math.isnan(ttft) and math.isnan(itl)


def test_a_rate_holds_only_when_the_whole_run_and_the_last_window_pass():
    steady = run([i * 0.5 for i in range(40)], ttft=0.5, gap=0.1)  # 20 s, 10 s windows
    cells, holds = verdict(steady, duration=20, window=10, objectives=OBJ)
    assert holds and cells == ["0.50 s / 100 ms"] * 3
    # the backlog grows: the last window's TTFT is 3 s; the whole run's p95 too
    growing = steady[:20] + run([10 + i * 0.5 for i in range(20)], ttft=3.0, gap=0.1)
    cells, holds = verdict(growing, duration=20, window=10, objectives=OBJ)
    assert not holds and cells[1] == "3.00 s / 100 ms ✗"
    # one failed request fails the run
    _, holds = verdict(steady + run([3.0], 0.5, 0.1, ok=False), 20, 10, OBJ)
    assert not holds


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        parse_args(["--rates", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--rates", "1", "--window", "900"])
    with pytest.raises(ValueError, match="--window"):
        verdict([], duration=10, window=0, objectives=OBJ)


def test_bandwidth_cell_gives_min_and_median_in_gb_per_s():
    assert bandwidth_cell([20e9, 8e9, 22e9]) == "8.0 / 20.0"
    assert bandwidth_cell([]) == "-"


def test_the_monitor_samples_until_stopped():
    """A counting sampler at a 10 ms interval: the first sample comes at
    start, more while running, none after stop."""
    calls = []

    def sample() -> float:
        calls.append(time.monotonic())
        return 1e9 * len(calls)

    monitor = BandwidthMonitor(0.01, sample).start()
    time.sleep(0.1)
    samples = monitor.stop()
    n = len(calls)
    time.sleep(0.05)
    assert len(calls) == n >= 3
    assert samples == [1e9 * (i + 1) for i in range(n)]
    with pytest.raises(ValueError, match="interval_s"):
        BandwidthMonitor(0)


def test_bandwidth_interval_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--rates", "1", "--bandwidth-interval", "0"])
    assert "--bandwidth-interval" in capsys.readouterr().err
