"""One registry holding the engine and request metrics of a server."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from paternoster.metrics.engine import EngineMetrics
from paternoster.metrics.requests import RequestMetrics


class ServerMetrics:
    """Every ``paternoster:`` metric of one server, in a private registry.

    Args:
        engine_stats: returns the engine's latest heartbeat stats
            (``EngineCore.stats()``; an empty dict before the first beat).
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_stats: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engine = EngineMetrics(self.registry, engine_stats)
        self.requests = RequestMetrics(self.registry)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (UTF-8 bytes)."""
        return generate_latest(self.registry)
