"""A decode step against the memory limit, measured in interleaved pairs.

The limit of a decode step is the bytes it must read (weights + KV) divided by
the memory bandwidth. On a shared VM the bandwidth moves by 2x within minutes,
so a step time and a bandwidth taken at different moments (or the fastest
bandwidth against the median step) do not compare. :func:`paired_rounds`
alternates a few decode steps with one bandwidth sample of each kind, so every
round gives a ratio of a step to the limit *at that moment*; the median of the
rounds' ratios is the figure, and the spread says how much the moment mattered.

Bandwidth kinds (:class:`BandwidthProbe`): *read*, a float32 ``sum`` over a
buffer far above the last-level cache (what a decode step does with its
weights), and *copy*, STREAM's "copy" kernel (McCalpin, "Memory Bandwidth and
Machine Balance", 1995), counting bytes read plus bytes written.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


class BandwidthProbe:
    """Two float32 buffers of ``size_mb`` MiB each, allocated and touched once,
    sampled by :meth:`sample`.

    Args:
        size_mb: buffer size in MiB (> 0; keep it far above the last-level cache).
    Raises:
        ValueError: ``size_mb`` <= 0.
    """

    def __init__(self, size_mb: int = 512) -> None:
        if size_mb <= 0:
            raise ValueError(f"size_mb must be > 0, got {size_mb}")
        self.src = torch.ones(size_mb << 18, dtype=torch.float32)
        self.dst = torch.zeros_like(self.src)
        self.nbytes = self.src.numel() * 4

    def sample(self) -> tuple[float, float]:
        """One timed read (``sum``) and one timed copy with torch's current
        thread count.

        Returns:
            (read bytes/s, copy bytes/s counting reads and writes).
        """
        t = time.perf_counter()
        self.src.sum()
        read = self.nbytes / (time.perf_counter() - t)
        t = time.perf_counter()
        self.dst.copy_(self.src)
        copy = 2 * self.nbytes / (time.perf_counter() - t)
        return read, copy


class BandwidthMonitor:
    """Read bandwidth sampled in a background thread while something else
    runs (a server under load), so that runs made one after another on a VM
    whose bandwidth drifts can be told apart.

    Each sample is one :meth:`BandwidthProbe.sample` (a 256 MiB read and
    copy: tens of milliseconds of memory traffic every ``interval_s``, a
    small, brief load on the machine being measured).

    Args:
        interval_s: seconds between samples (> 0); the first is taken at
            :meth:`start`.
        sample: returns read bytes/s; default a :class:`BandwidthProbe` of
            256 MiB sampled with torch's current thread count.
    Raises:
        ValueError: ``interval_s`` <= 0.
    """

    def __init__(self, interval_s: float = 30.0,
                 sample: Callable[[], float] | None = None) -> None:  # fmt: skip
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._sample = sample
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BandwidthMonitor:
        """Start sampling (the first sample at once). Returns ``self``."""
        if self._sample is None:
            probe = BandwidthProbe(256)
            self._sample = lambda: probe.sample()[0]
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.samples.append(self._sample())
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> list[float]:
        """Stop sampling and return every sample, read bytes/s, in order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return list(self.samples)


@dataclass
class PairedRound:
    """One round: the median decode step and the bandwidths right after it."""

    step_s: float
    read_bps: float
    copy_bps: float
    bytes_per_step: float

    def ratio(self, kind: str) -> float:
        """Step time / memory limit at this round's ``kind`` (``read``/``copy``) bandwidth."""
        bw = self.read_bps if kind == "read" else self.copy_bps
        return self.step_s / (self.bytes_per_step / bw)


def paired_rounds(step: Callable[[], object], bytes_per_step: Callable[[], float],
                  probe: BandwidthProbe, rounds: int = 15, steps_per_round: int = 5,
                  settle_s: float = 0.05) -> list[PairedRound]:
    """Alternate ``steps_per_round`` calls of ``step`` with one bandwidth sample.

    Args:
        step: runs one decode step.
        bytes_per_step: bytes the next step reads (weights + the KV of its context).
        probe: the bandwidth buffers.
        rounds: rounds (>= 1).
        steps_per_round: timed steps per round (>= 1); the round keeps their median.
        settle_s: pause before the bandwidth sample (s): threads that spin after
            a step (the core's pool, OpenMP's wait policy) would otherwise
            share the cores with the sample and lower it.
    Returns:
        One :class:`PairedRound` per round, in order.
    Raises:
        ValueError: ``rounds`` or ``steps_per_round`` < 1.
    """
    if rounds < 1 or steps_per_round < 1:
        raise ValueError(f"rounds and steps_per_round must be >= 1, got {rounds}, "
                         f"{steps_per_round}")
    out = []
    for _ in range(rounds):
        need = bytes_per_step()
        times = []
        for _ in range(steps_per_round):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        time.sleep(settle_s)  # let the step's spinning threads (core pool, OpenMP) go idle
        read, copy = probe.sample()
        out.append(PairedRound(statistics.median(times), read, copy, need))
    return out


def summarize(pairs: list[PairedRound]) -> str:
    """Median step, bandwidths and step/limit ratios (with their range) as text."""
    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    lines = [f"paired rounds: {len(pairs)}; median step "
             f"{1e3 * med([p.step_s for p in pairs]):.2f} ms; read "
             f"{med([p.read_bps for p in pairs]) / 1e9:.1f} GB/s, copy "
             f"{med([p.copy_bps for p in pairs]) / 1e9:.1f} GB/s"]
    for kind in ("read", "copy"):
        r = sorted(p.ratio(kind) for p in pairs)
        lines.append(f"step / limit at the {kind} bandwidth of the same round: median "
                     f"{med(r):.2f}x (range {r[0]:.2f}-{r[-1]:.2f}x)")
    return "\n".join(lines)
