"""Scrape and read GET /metrics in tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of ``url + "/metrics"`` as ``{(name, sorted labels): value}``."""
    r = httpx.get(url + "/metrics", timeout=5)
    r.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: dict, before: dict, name: str, **labels: str) -> float:
    """How much a sample grew between two scrapes."""
    return value(after, name, **labels) - value(before, name, **labels)
