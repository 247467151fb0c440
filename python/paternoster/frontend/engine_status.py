"""What ``/stats`` and ``/health`` say about several engines: their stats
added up, their reasons for refusing requests joined, each one described.
Pure functions over :class:`~paternoster.frontend.engine_client.EngineClient`
s, used by :class:`~paternoster.frontend.data_parallel.DataParallelClient`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Engine stats averaged over engines in the aggregate ``/stats``; the other
#: numbers are summed.
FRACTIONS = ("kv_cache_usage", "state_slot_usage")


def sum_stats(per_engine: Sequence[dict]) -> dict:
    """The numeric stats of ``per_engine`` (non-empty dicts) added up, the
    usage fractions of :data:`FRACTIONS` averaged; non-numbers are left out."""
    total: dict = {}
    for stats in per_engine:
        for key, value in stats.items():
            if isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
    for key in FRACTIONS:
        if key in total:
            total[key] /= len(per_engine)
    return total


def join_reasons(reasons: Sequence[str | None]) -> str:
    """One message from each engine's reason it cannot serve (one engine: its
    reason alone)."""
    if len(reasons) == 1:
        return str(reasons[0])
    return "no engine can serve: " + "; ".join(f"engine {i}: {r}"
                                               for i, r in enumerate(reasons))  # fmt: skip


def describe_engine(index: int, client: Any) -> dict:
    """Engine ``index``'s state for ``/health`` and ``/stats`` (its
    :class:`~paternoster.frontend.engine_client.EngineClient` ``client``)."""
    return {
        "index": index,
        "alive": client.is_alive,
        "dead_reason": client.dead_reason,
        "unavailable_reason": client.unavailable_reason,
        "num_restarts": client.num_restarts,
        "num_in_flight": client.num_in_flight,
        "engine_pid": client.pid,
        "num_threads": client.info.get("num_threads"),
        "cpus": list(client.supervisor.config.cpus or []) or None,
        "env": dict(client.supervisor.env) or None,
        **client.location,
        "engine": client.stats,
    }
