"""The operator routes of the HTTP server, beside the OpenAI API: GET /health,
GET /stats, GET /metrics (Prometheus), GET /debug/timeline and
POST /reset_prefix_cache, as a FastAPI router that api_server.py includes."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from paternoster.entrypoints.openai.errors import ERROR_RESPONSES, APIError
from paternoster.entrypoints.openai.protocol import ErrorResponse
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.errors import EngineDeadError, TimelineUnavailableError
from paternoster.metrics.server import ServerMetrics


def admin_router(client: DataParallelClient, metrics: ServerMetrics) -> APIRouter:
    """The operator routes over ``client`` and the server's ``metrics``.

    Args:
        client: the started engine client the server runs on.
        metrics: the server's Prometheus metrics (GET /metrics renders them).
    Returns:
        A router for ``app.include_router``.
    """
    router = APIRouter()

    @router.get("/health")
    async def health() -> JSONResponse:
        """200 ``{"status": "ok"}`` while at least one engine serves, or 503
        with the reason none can: dead, restarting, stalled (no heartbeat for
        ``--engine-stall-timeout`` seconds; 200 again once it resumes) or
        shutting down. ``engines`` gives each engine's ``status`` (and
        ``reason`` when it cannot serve)."""
        engines = [{"engine": i, "status": "ok"} if r is None else
                   {"engine": i, "status": "unhealthy", "reason": r}
                   for i, r in enumerate(c.unavailable_reason for c in client.engines)]  # fmt: skip
        reason = client.unavailable_reason
        if reason is None:
            return JSONResponse({"status": "ok", "engines": engines})
        return JSONResponse({"status": "unhealthy", "reason": reason, "engines": engines},
                            status_code=503)  # fmt: skip

    @router.get("/stats")
    async def stats() -> JSONResponse:
        """Frontend counters (live) and the engines' stats as of their latest
        ``outputs`` message (sent after every step) or heartbeat (every 0.5 s),
        whichever is newer, added up in ``engine``; plus engine 0's pid and
        thread count, and in ``engines`` each engine's state, pid, threads
        and stats; ``router`` counts requests routed by prefix affinity and by load, and
        those sent again because their engine died before their first output."""
        return JSONResponse(
            {
                "alive": client.is_alive,
                "dead_reason": client.dead_reason,
                "unavailable_reason": client.unavailable_reason,
                "num_in_flight": client.num_in_flight,
                "num_waiting": client.num_waiting,
                "num_waiting_tokens": client.num_waiting_tokens,
                "num_reserved": client.num_reserved,
                "num_reserved_tokens": client.num_reserved_tokens,
                "engine_pid": client.pid,
                "scheduler": client.info.get("scheduler"),
                "num_threads": client.info.get("num_threads"),
                "engine": client.stats,
                "engines": client.describe_engines(),
                "router": {"policy": client.router.policy,
                           "affinity": client.router.num_affinity_routed,
                           "load": client.router.num_load_routed,
                           "round_robin": client.router.num_round_robin_routed,
                           "rerouted": client.num_rerouted},
            }
        )

    @router.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus metrics (text exposition format); see docs/metrics.md."""
        return Response(metrics.render(), media_type=metrics.content_type)

    @router.get(
        "/debug/timeline",
        responses={
            400: ERROR_RESPONSES[400],
            404: {"model": ErrorResponse, "description": "timelines are off (--timeline-size 0)"},
            503: ERROR_RESPONSES[503],
        },
    )
    async def debug_timeline(format: str = "chrome", engine: int = 0) -> Response:
        """An engine's request timeline (docs/metrics.md): ``format=chrome`` (default)
        a Chrome/Perfetto trace, ``format=snapshot`` the raw snapshot; ``engine``
        picks the data-parallel engine (default 0). 404 when timelines are off,
        503 when the engine is down, 400 for another format or engine."""
        if format not in ("chrome", "snapshot"):
            raise APIError(400, "format must be 'chrome' or 'snapshot'", "format")
        if not 0 <= engine < client.num_engines:
            raise APIError(400, f"engine must be in [0, {client.num_engines})", "engine")
        try:
            snapshot = await client.timeline(engine=engine)
        except TimelineUnavailableError as e:
            raise APIError(404, str(e)) from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(503, f"engine unavailable: {e}") from None
        # A full ring buffer is megabytes of JSON: build it off the event loop.
        body = await asyncio.to_thread(_timeline_body, snapshot, format)
        return Response(body, media_type="application/json")

    @router.post(
        "/reset_prefix_cache",
        responses={400: ERROR_RESPONSES[400], 503: ERROR_RESPONSES[503]},
    )
    async def reset_prefix_cache() -> JSONResponse:
        """Forget every cached KV block (vLLM's operator endpoint), e.g. to measure
        cold-cache latency; running requests keep their blocks. Returns
        ``{"num_blocks_reset": N}``; 400 when the engine has no prefix cache, 503
        when it is down."""
        try:
            n = await client.reset_prefix_cache()
        except ValueError as e:
            raise APIError(400, str(e)) from None
        except (EngineDeadError, TimeoutError) as e:
            raise APIError(503, f"engine unavailable: {e}") from None
        return JSONResponse({"num_blocks_reset": n})

    return router


def _timeline_body(snapshot: dict, fmt: str) -> bytes:
    """The JSON body of GET /debug/timeline: the snapshot, or its Chrome trace."""
    from paternoster.metrics.chrome_trace import to_chrome_trace

    return json.dumps(snapshot if fmt == "snapshot" else to_chrome_trace(snapshot)).encode()
