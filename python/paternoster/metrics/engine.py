"""Engine-side metrics: scheduler gauges, preemptions and tokens per step.

The numbers come from the engine process over the ZMQ link: gauges and the
preemption counter from the latest heartbeat's ``stats`` (at most one
heartbeat interval old, 0.5 s by default), tokens per step from the
``iteration_tokens`` field of ``outputs`` messages. Every sample carries an
``engine`` label: the engine's index (``"0"`` .. ``"N-1"`` with
``--data-parallel-size N``; ``"0"`` alone otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: The label naming the engine a sample is about.
ENGINE_LABEL = "engine"
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class _EngineStatsCollector(Collector):
    """Reads every engine's heartbeat stats at scrape time and exposes them,
    one sample per engine."""

    def __init__(self, engine_stats: Callable[[], Sequence[dict]]) -> None:
        self._engine_stats = engine_stats

    def collect(self) -> Iterator[Metric]:
        per_engine = list(self._engine_stats())
        for family, name, doc, key in _ENGINE_FAMILIES:
            metric = family(name, doc, labels=[ENGINE_LABEL])
            for i, stats in enumerate(per_engine):
                metric.add_metric([str(i)], float((stats or {}).get(key, 0)))
            yield metric


#: (family, metric name, help, heartbeat stats key) of the engine-side metrics.
_ENGINE_FAMILIES: tuple[tuple[type, str, str, str], ...] = (
    (GaugeMetricFamily, "paternoster:num_requests_running",
     "Requests in the engine's running batch (requests).", "num_running"),
    (GaugeMetricFamily, "paternoster:num_requests_waiting",
     "Requests waiting to be scheduled, preempted ones included (requests).", "num_waiting"),
    (GaugeMetricFamily, "paternoster:kv_cache_usage_perc",
     "Fraction of KV cache blocks in use (0-1; 1 = full).", "kv_cache_usage"),
    (GaugeMetricFamily, "paternoster:state_slot_usage_perc",
     "Fraction of recurrent-state slots in use (linear-attention models; 0-1).",
     "state_slot_usage"),
    (CounterMetricFamily, "paternoster:num_preemptions",
     "Requests preempted (recompute) since the engine started (preemptions).",
     "num_preemptions_total"),
    (CounterMetricFamily, "paternoster:prefix_cache_queries",
     "Tokens looked up in the prefix cache when requests were admitted (tokens).",
     "prefix_cache_queries"),
    (CounterMetricFamily, "paternoster:prefix_cache_hits",
     "Of the looked-up tokens, those found cached (tokens).", "prefix_cache_hits"),
)


class EngineMetrics:
    """Engine gauges (read from heartbeats) and the tokens-per-step histogram,
    labelled by engine.

    Args:
        registry: where to register.
        engine_stats: returns each engine's latest heartbeat stats
            (``EngineCore.stats()``; an empty dict before its first beat),
            engine 0 first.
        num_engines: engines whose histogram is exposed (at 0) from the start.
    """

    def __init__(self, registry: CollectorRegistry, engine_stats: Callable[[], Sequence[dict]],
                 num_engines: int = 1) -> None:  # fmt: skip
        registry.register(_EngineStatsCollector(engine_stats))
        self.iteration_tokens = Histogram(
            "paternoster:iteration_tokens_total",
            "Tokens the forward pass computed per engine step (tokens).",
            [ENGINE_LABEL],
            buckets=ITERATION_TOKENS_BUCKETS,
            registry=registry,
        )
        for i in range(num_engines):
            self.iteration_tokens.labels(str(i))

    def observe_iteration_tokens(self, tokens: Iterable[int], engine: int = 0) -> None:
        """Record engine steps.

        Args:
            tokens: tokens computed by each step (one int per step).
            engine: the index of the engine that ran them.
        """
        histogram = self.iteration_tokens.labels(str(engine))
        for n in tokens:
            histogram.observe(n)
