"""Prometheus metrics of the OpenAI server (GET /metrics); docs/metrics.md lists them.

Each :class:`ServerMetrics` owns its own ``CollectorRegistry`` (never the
process-global one), so several apps can live in one process (tests).
"""

from paternoster.metrics.engine import EngineMetrics
from paternoster.metrics.requests import RequestMetrics, RequestTracker
from paternoster.metrics.server import ServerMetrics

__all__ = ["EngineMetrics", "RequestMetrics", "RequestTracker", "ServerMetrics"]
