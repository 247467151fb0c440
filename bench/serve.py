"""The serving benchmark's load generator: send a workload to an
OpenAI-compatible endpoint on an arrival schedule, stream every response, and
collect one :class:`~paternoster.bench.client.RequestRecord` per request.

The schedule is absolute: request ``i`` is due at ``start + offset[i]`` and the
sender sleeps until then, whatever earlier requests are doing, so a slow
server does not lower the offered load (open loop). ``max_concurrency`` caps
the requests in flight (a due request waits for a slot; its ``sent`` time
shows the wait); with an infinite rate that is a closed loop at fixed
concurrency.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from paternoster.bench.client import RequestRecord, build_payload, stream_request
from paternoster.bench.stats import SLOs, summarize
from paternoster.bench.workload import BenchRequest, arrival_offsets

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class ServeConfig:
    """How to drive the endpoint.

    Attributes:
        base_url: e.g. ``http://127.0.0.1:8000``.
        model: model id sent in every request.
        api: ``"completions"`` or ``"chat"``.
        endpoint: path under ``base_url`` (default by ``api``).
        request_rate: mean arrivals per second (``inf``: all at once).
        burstiness: gamma shape of the inter-arrival gaps (1 = Poisson).
        max_concurrency: most requests in flight (``None``: no cap).
        trace_timing: send at the workload's own ``arrival_time`` (a JSONL
            trace) instead of drawing arrivals.
        seed: RNG seed of the arrivals.
        temperature: sampling temperature. ignore_eos: send ``ignore_eos``.
        extra_body: more JSON fields for every request.
        timeout: seconds one request may take in all before it counts as an error.
        api_key: sent as ``Authorization: Bearer ...``.
        slos: objectives for goodput.
        progress: show a progress bar (on stderr, when it is a terminal).
    Raises:
        ValueError: a field out of range (the message names it).
    """

    base_url: str
    model: str
    api: str = "completions"
    endpoint: str | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    trace_timing: bool = False
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = False
    extra_body: dict = field(default_factory=dict)
    timeout: float = 600.0
    api_key: str | None = None
    slos: SLOs = field(default_factory=SLOs)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.api not in ENDPOINTS:
            raise ValueError(f"api must be one of {sorted(ENDPOINTS)}, got {self.api!r}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 req/s (or inf), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")

    @property
    def url(self) -> str:
        """The full request URL."""
        return self.base_url.rstrip("/") + (self.endpoint or ENDPOINTS[self.api])

    def to_dict(self) -> dict:
        """JSON-ready dict (no API key)."""
        d = asdict(self)
        d["api_key"] = "***" if self.api_key else None
        d["url"] = self.url
        return d


@dataclass
class ServeResult:
    """One benchmark run: its config, per-request records, duration (seconds,
    from the start of the schedule to the end of the last request) and summary."""

    config: ServeConfig
    records: list[RequestRecord]
    duration: float
    summary: dict
    workload: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready dict: ``config``, ``workload``, ``summary``, ``requests``."""
        return jsonable(
            {
                "config": self.config.to_dict(),
                "workload": self.workload,
                "summary": self.summary,
                "requests": [r.to_dict() for r in self.records],
            }
        )


def jsonable(x: Any) -> Any:
    """``x`` with non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``
    (strict JSON has no infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def schedule(config: ServeConfig, requests: Sequence[BenchRequest]) -> list[float]:
    """Send offsets in seconds from the start, one per request.

    Raises:
        ValueError: ``trace_timing`` with a request that has no ``arrival_time``.
    """
    if config.trace_timing:
        if any(r.arrival_time is None for r in requests):
            raise ValueError("trace timing needs an arrival_time on every request")
        t0 = min(r.arrival_time for r in requests)  # type: ignore[type-var]
        return [r.arrival_time - t0 for r in requests]  # type: ignore[operator]
    return arrival_offsets(
        len(requests), config.request_rate, config.burstiness, config.seed
    ).tolist()


def _headers(config: ServeConfig) -> dict:
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}


async def run_serve(
    config: ServeConfig,
    requests: Sequence[BenchRequest],
    send_window: float | None = None,
    desc: str | None = None,
) -> ServeResult:
    """Send ``requests`` on the schedule and wait for every response.

    Args:
        config: endpoint and load.
        requests: the workload, in send order.
        send_window: seconds after the start past which nothing more is sent;
            those requests are recorded with ``sent=None`` (not errors).
        desc: progress bar label.
    Returns:
        The run; failures are counted in it, never raised.
    Raises:
        ValueError: an unusable schedule (see :func:`schedule`).
    """
    from tqdm import tqdm

    offsets = schedule(config, requests)
    records = [
        RequestRecord(i, r.tag, r.prompt_len, r.output_len, offsets[i])
        for i, r in enumerate(requests)
    ]
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    limits = httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=None)
    timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 30.0))
    headers = _headers(config)
    bar = tqdm(
        total=len(requests),
        desc=desc or "requests",
        disable=None if config.progress else True,  # None: off when stderr is no TTY
        unit="req",
        dynamic_ncols=True,
        leave=False,
    )
    num_errors = 0

    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.perf_counter()

        async def one(req: BenchRequest, rec: RequestRecord) -> None:
            nonlocal num_errors
            if slots is not None:
                await slots.acquire()
            try:
                now = time.perf_counter() - start
                if send_window is not None and now > send_window:
                    return
                rec.sent = now
                payload = build_payload(
                    config.api,
                    config.model,
                    req.prompt,
                    req.output_len,
                    temperature=config.temperature,
                    ignore_eos=config.ignore_eos,
                    extra=config.extra_body,
                )
                work = stream_request(client, config.url, payload, config.api, rec, headers)
                try:
                    await asyncio.wait_for(work, config.timeout)
                except asyncio.TimeoutError:
                    rec.error = f"timeout after {config.timeout:g} s"
            finally:
                if slots is not None:
                    slots.release()
                if rec.sent is not None and not rec.success:
                    num_errors += 1
                    bar.set_postfix(errors=num_errors, refresh=False)
                bar.update(1)

        tasks = []
        for req, rec in zip(requests, records):
            if send_window is not None and rec.scheduled > send_window:
                break
            delay = start + rec.scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req, rec)))
        bar.update(len(requests) - len(tasks))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return ServeResult(config, records, duration, summarize(records, duration, config.slos))


async def warm_up(config: ServeConfig, requests: Sequence[BenchRequest]) -> int:
    """Send ``requests`` (at most 4 at a time), discarding the measurements.

    Returns:
        How many failed.
    """
    cfg = replace(
        config, request_rate=math.inf, max_concurrency=4, trace_timing=False, progress=False
    )
    result = await run_serve(cfg, requests)
    return result.summary["num_errors"]


def fetch_model_info(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> dict:
    """The first entry of ``GET {base_url}/v1/models`` (``id``, and on vLLM-style
    servers ``max_model_len``).

    Raises:
        ValueError: the server cannot be reached or lists no model.
    """
    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url, headers=headers, timeout=timeout)
        r.raise_for_status()
        models = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        raise ValueError(f"cannot list models at {url} ({e}); pass --model") from None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise ValueError(f"{url} lists no model; pass --model")
    return models[0]


def save_json(result: ServeResult, path: str | Path) -> None:
    """Write ``result.to_dict()`` to ``path`` (strict JSON)."""
    import json

    Path(path).write_text(json.dumps(result.to_dict(), indent=1, allow_nan=False) + "\n")
