"""Calibrate the cost model by timing the real ModelRunner on synthetic batches.

Each probe batch is a list of rows ``(cached_tokens, new_tokens)``: prefills of
several sizes (with and without cached context, i.e. chunks), decode batches of
several sizes and context lengths, and mixes of both. The real C++
``KVCacheManager`` and ``BatchBuilder`` build every batch; one probe's time is
the median of a few runs of build + forward + greedy sampling (after a warm-up
run). :meth:`CostModel.fit` then fits the coefficients, and the model's
``step_noise`` is estimated from how the runs scatter (see :func:`step_noise`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from paternoster.scheduling.cost_model import CostModel, StepWork

Row = tuple[int, int]

#: Probe batches: rows of ``(cached tokens, new tokens)``. About 30 s with the
#: default model (SmolLM2-135M, bf16, one thread) on the project's 2-core CPU.
DEFAULT_PROBES: tuple[tuple[str, tuple[Row, ...]], ...] = (
    ("prefill 32", ((0, 32),)),
    ("prefill 128", ((0, 128),)),
    ("prefill 256", ((0, 256),)),
    ("prefill 512", ((0, 512),)),
    ("prefill 1024", ((0, 1024),)),
    ("chunk 256 @ 1024", ((1024, 256),)),
    ("chunk 256 @ 3072", ((3072, 256),)),
    ("chunk 512 @ 2048", ((2048, 512),)),
    ("2 x prefill 256", ((0, 256), (0, 256))),
    ("decode 1 @ 128", ((128, 1),)),
    ("decode 4 @ 128", ((128, 1),) * 4),
    ("decode 16 @ 128", ((128, 1),) * 16),
    ("decode 32 @ 128", ((128, 1),) * 32),
    ("decode 64 @ 128", ((128, 1),) * 64),
    ("decode 16 @ 1024", ((1024, 1),) * 16),
    ("decode 8 @ 3072", ((3072, 1),) * 8),
    ("decode 32 @ 512", ((512, 1),) * 32),
    ("decode 16 @ 256 + prefill 256", ((256, 1),) * 16 + ((0, 256),)),
    ("decode 32 @ 512 + chunk 512 @ 1024", ((512, 1),) * 32 + ((1024, 512),)),
)


@dataclass(frozen=True)
class CalibrationSample:
    """One timed probe.

    Attributes:
        name: the probe's label. work: what it computes.
        seconds: measured step time (median run). predicted: the fitted model's time.
        runs: every timed run's seconds.
    """

    name: str
    work: StepWork
    seconds: float
    predicted: float
    runs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model with the measurements behind it.

    Attributes:
        cost_model: the fit. r2: its coefficient of determination.
        samples: the probes, measured and predicted.
        r2_four_terms: R² of the four-term fit (one ``a_kv`` for every
            attended key) on the same probes, for comparison.
    """

    cost_model: CostModel
    r2: float
    samples: tuple[CalibrationSample, ...]
    r2_four_terms: float | None = None

    def report(self) -> str:
        """A plain-text table of the probes and the fitted coefficients."""
        cm = self.cost_model
        lines = [f"{'probe':<36} {'measured ms':>12} {'fit ms':>9} {'error':>7}"]
        for s in self.samples:
            err = (s.predicted - s.seconds) / s.seconds
            lines.append(
                f"{s.name:<36} {s.seconds * 1e3:12.2f} {s.predicted * 1e3:9.2f} {err:+7.1%}"
            )
        lines += [
            f"overhead  = {cm.overhead * 1e3:.3f} ms/step",
            f"a_prefill = {cm.a_prefill * 1e6:.3f} us/prefill token",
            f"a_decode  = {cm.a_decode * 1e6:.3f} us/decode token",
            f"a_kv      = {cm.a_kv * 1e9:.3f} ns/key attended by a decode token",
            f"a_kv_prefill = {cm.per_key_prefill * 1e9:.3f} ns/key attended by a prefill token",
            f"R^2       = {self.r2:.4f}   ({cm.source})",
            f"step_noise = {cm.step_noise:.3f} (sd of log measured/modelled step time)",
        ]
        if self.r2_four_terms is not None:
            lines.append(f"(four-term fit, one a_kv for every key: R^2 = {self.r2_four_terms:.4f})")
        return "\n".join(lines)


def calibrate(
    model: str | None = None,
    dtype: str = "bfloat16",
    num_threads: int = 1,
    block_size: int = 16,
    probes: Sequence[tuple[str, Sequence[Row]]] = DEFAULT_PROBES,
    repeats: int = 3,
    log: Callable[[str], None] | None = None,
) -> Calibration:
    """Time the real ModelRunner on ``probes`` and fit a :class:`CostModel`.

    Args:
        model: HF model directory; ``None`` means the embedded default model
            (SmolLM2-135M-Instruct, converted on first use).
        dtype: ``bfloat16``, ``float32``, ``float16`` or ``auto``.
        num_threads: torch and C++ kernel threads while timing (restored after).
        block_size: tokens per KV block.
        probes: ``(name, rows)`` batches, rows ``(cached tokens, new tokens)``.
        repeats: timed runs per probe (the median counts), after one warm-up run.
        log: called with a line per probe (progress); ``None`` is silent.
    Returns:
        The fit, its R² and every probe's measured and fitted time.
    Raises:
        ValueError: bad model directory or dtype, fewer than 5 probes.
    """
    import torch

    from paternoster import _core
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.entrypoints.engine_args import resolve_model_dir
    from paternoster.model.runner import ModelRunner
    from paternoster.sampling_params import SamplingParams

    if len(probes) < 5:
        raise ValueError("calibration needs at least 5 probes")
    model_dir = resolve_model_dir(model)
    max_tokens = max(sum(c + n for c, n in rows) for _, rows in probes)
    num_blocks = max(sum(-(-(c + n) // block_size) for c, n in rows) for _, rows in probes)
    max_len = max(c + n for _, rows in probes for c, n in rows)
    old_threads, old_core = torch.get_num_threads(), _core.get_num_threads()
    torch.set_num_threads(num_threads)
    _core.set_num_threads(num_threads)
    try:
        runner = ModelRunner(
            ModelConfig(model_dir, dtype=dtype, max_model_len=max_len),
            CacheConfig(block_size=block_size, num_kv_blocks=num_blocks),
        )
        kv = _core.KVCacheManager(num_blocks, block_size)
        builder = _core.BatchBuilder(kv)
        greedy = SamplingParams(temperature=0.0)
        rng = np.random.default_rng(0)
        vocab = min(runner.vocab_size, 32_000)

        def run_probe(rows: Sequence[Row]) -> list[float]:
            """``repeats`` timed steps over ``rows`` (seconds), after a warm-up."""
            ids = np.arange(len(rows), dtype=np.int64)
            for i, (c, n) in zip(ids.tolist(), rows):
                builder.add_request(i, rng.integers(0, vocab, c + n))
                kv.allocate_slots(i, c + n)
            computed = np.asarray([c for c, _ in rows], np.int32)
            scheduled = np.asarray([n for _, n in rows], np.int32)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                batch = builder.build(ids, computed, scheduled)
                logits = runner.compute_logits(batch)
                runner.sampler.sample(logits, [greedy] * len(rows), [None] * len(rows))
                times.append(time.perf_counter() - t0)
            for i in ids.tolist():
                builder.remove_request(i)
                kv.free(i)
            return times[1:]

        measured = []
        for name, rows in probes:
            runs = run_probe(rows)
            seconds = float(np.median(runs))
            work = StepWork.from_arrays(
                np.array([c for c, _ in rows]),
                np.array([n for _, n in rows]),
                np.array([c if n == 1 else c + n for c, n in rows]),
            )
            measured.append((name, work, seconds, tuple(runs)))
            if log:
                log(f"  {name:<36} {seconds * 1e3:9.2f} ms")
    finally:
        torch.set_num_threads(old_threads)
        _core.set_num_threads(old_core)
    source = (
        f"calibrated: {os.path.basename(str(model_dir).rstrip('/'))}, {runner.dtype}, "
        f"{num_threads} thread(s), block size {block_size}, {len(probes)} probes, "
        f"up to {max_tokens} KV tokens"
    )
    works, seconds = [m[1] for m in measured], [m[2] for m in measured]
    # Five terms, no first-tokens knee: slo plans with this model, and planning
    # with the knee cost it 6 % capacity on the long mix (docs/benchmarks.md,
    # "Sixth run"); the timeline fits (fit_timeline) choose a knee.
    cost_model, r2 = CostModel.fit(works, seconds, source)
    _, r2_four_terms = CostModel.fit(works, seconds, split_kv=False)
    samples = tuple(
        CalibrationSample(name, w, s, cost_model.step_time(w), runs)
        for name, w, s, runs in measured
    )
    cost_model = dataclasses.replace(cost_model, step_noise=step_noise(samples))
    return Calibration(cost_model, r2, samples, r2_four_terms)


def step_noise(samples: Sequence[CalibrationSample]) -> float:
    """How far measured step times scatter around the model, as the standard
    deviation of ``log(measured / modelled)``: the runs' scatter around
    their probe's mean log time (pooled, ``k - 1`` degrees of freedom per
    probe) plus the fit's own error (each probe's median against the model),
    added as variances. Runs back to back in one process see less of a
    shared machine's slow minutes than a server does, so this is a lower
    bound on a server's noise.

    Raises:
        ValueError: no probe has two runs.
    """
    within, dof = 0.0, 0
    for s in samples:
        if len(s.runs) >= 2:
            logs = np.log(np.asarray(s.runs, dtype=np.float64))
            within += float(np.sum((logs - logs.mean()) ** 2))
            dof += len(logs) - 1
    if dof == 0:
        raise ValueError("step_noise needs probes with at least two runs")
    fit = [np.log(s.seconds / s.predicted) for s in samples if s.predicted > 0]
    misfit = float(np.mean(np.square(fit))) if fit else 0.0
    return float(np.sqrt(within / dof + misfit))
