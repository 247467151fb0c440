"""Observability: Prometheus metrics of the OpenAI server (GET /metrics;
:mod:`~paternoster.metrics.server`, :mod:`~paternoster.metrics.engine`,
:mod:`~paternoster.metrics.requests`) and request timelines
(:mod:`~paternoster.metrics.timeline`, exported by
:mod:`~paternoster.metrics.chrome_trace` and :mod:`~paternoster.metrics.gantt`).
docs/metrics.md lists them.

Nothing is imported here: the engine process imports the timeline recorder
without pulling in prometheus_client.
"""
