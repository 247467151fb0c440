"""One registry holding the engine and request metrics of a server."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from paternoster.metrics.engine import EngineMetrics
from paternoster.metrics.requests import DEFAULT_MAX_TENANTS, RequestMetrics


class ServerMetrics:
    """Every ``paternoster:`` metric of one server, in a private registry.

    Args:
        engine_stats: returns each engine's latest heartbeat stats
            (``EngineCore.stats()``; an empty dict before its first beat),
            engine 0 first (one dict with one engine).
        num_engines: the engines behind the server.
        max_tenants: distinct tenants labelled by name in the per-tenant
            request metrics (:class:`RequestMetrics`).
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine_stats: Callable[[], Sequence[dict]], num_engines: int = 1,
                 max_tenants: int = DEFAULT_MAX_TENANTS) -> None:  # fmt: skip
        self.registry = CollectorRegistry(auto_describe=True)
        self.engine = EngineMetrics(self.registry, engine_stats, num_engines)
        self.requests = RequestMetrics(self.registry, max_tenants)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (UTF-8 bytes)."""
        return generate_latest(self.registry)
