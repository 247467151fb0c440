"""A chaos soak: load, engine kills and malformed requests at once, and a
count of every request's fate.

    .venv/bin/python bench/chaos_soak.py --rate 1.6 --duration 600

Starts ``paternoster serve --data-parallel-size 2 --restart-engine`` (plus
``--serve-args``), sends the CPU mix (streamed completions, Poisson arrivals
at ``--rate`` req/s; 80 % of the server's measured capacity is the intended
load) for ``--duration`` seconds, SIGKILLs a random live engine every
``--kill-every`` seconds (uniform in the range) and sends one malformed
request every ``--malformed-every`` seconds. Every request ends in exactly
one of:

- **completed**: the stream ended normally (a finish reason, ``[DONE]``);
- **failed**: an error the client can act on: an HTTP error or an SSE error
  event carrying a message (a request whose engine died after its first
  token, as documented);
- **slow**: no end within ``--request-timeout`` seconds, but tokens were
  still arriving (within ``--stall`` seconds of the timeout): the server was
  over its capacity, not stuck;
- **hung**: no end within ``--request-timeout`` seconds and no token in the
  last ``--stall`` seconds (must be 0; a request still queued at the timeout
  counts here, so pick a load the server can serve);
- **lost**: it ended without a result or a message (a dropped connection, a
  stream cut before its end; must be 0).

A malformed request must get a 4xx whose body is an OpenAI error object
with a message. The report gives those counts, the server's RSS (frontend
and engines, first and last minute), and p95 TTFT / ITL of the completed
requests whose lifetime touched no kill window (``--kill-window`` seconds
from each kill) and of those that did. Not part of ``make test``: it runs for
minutes and is a measurement, not a check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil

from paternoster.bench.client import RequestRecord, build_payload, stream_request
from paternoster.bench.peer_servers import CPU_MIX, free_port, paternoster_cli, running_server
from paternoster.bench.workload import PromptMaker, arrival_offsets, make_mix, parse_mix

#: Bodies a careless client sends: (name, route, body). Each must be a 4xx
#: with an OpenAI error object (``{"error": {"message": ...}}``).
MALFORMED: tuple[tuple[str, str, bytes], ...] = (
    ("not JSON", "/v1/completions", b"{not json"),
    ("empty body", "/v1/chat/completions", b""),
    ("no prompt", "/v1/completions", b'{"model": "m", "max_tokens": 4}'),
    ("max_tokens -1", "/v1/completions", b'{"prompt": "hi", "max_tokens": -1}'),
    ("temperature as text", "/v1/completions", b'{"prompt": "hi", "temperature": "hot"}'),
    ("content []", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": []}]}'),
    ("text part without text", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}'),
    ("tool message without tool_call_id", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}'),
    ("unknown role", "/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "hi"}]}'),
    ("prompt of 10^6 tokens", "/v1/completions",
     json.dumps({"prompt": [1] * 1_000_000, "max_tokens": 1}).encode()),
)

#: ``fate`` values, in report order.
FATES = ("completed", "failed", "slow", "hung", "lost")


def fate(record: RequestRecord, timed_out: bool, timeout: float = math.inf,
         stall: float = 30.0) -> str:
    """What became of one load request: ``completed``, ``failed`` (an error
    with a message), ``slow`` (``timed_out`` after ``timeout`` seconds while
    its last token came less than ``stall`` seconds before), ``hung``
    (``timed_out`` otherwise) or ``lost`` (no result and no message: a
    dropped connection or a stream cut short)."""
    if timed_out:
        if record.ttft is not None and timeout - (record.ttft + sum(record.itl)) < stall:
            return "slow"
        return "hung"
    if record.success:
        return "completed"
    err = record.error or ""
    if err.startswith("HTTP ") and record.status_code is not None:
        message = err.split(":", 1)[1].strip() if ":" in err else ""
        return "failed" if message else "lost"
    if err.startswith("error in stream:") and err.split(":", 1)[1].strip() not in ("", "None"):
        return "failed"
    return "lost"


def clear_error(status: int, body: bytes) -> bool:
    """Whether a reply to a malformed request is the error a client can act
    on: a 4xx whose JSON body is ``{"error": {"message": non-empty str, ...}}``."""
    if not 400 <= status < 500:
        return False
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(err, dict) and isinstance(err.get("message"), str) and bool(err["message"])


def touches(start: float, end: float, windows: list[tuple[float, float]]) -> bool:
    """Whether ``[start, end]`` overlaps any of ``windows`` (seconds)."""
    return any(start <= w_end and w_start <= end for w_start, w_end in windows)


def window_share(windows: list[tuple[float, float]], duration: float) -> float:
    """The share of ``[0, duration]`` that the union of ``windows`` covers."""
    covered, reach = 0.0, 0.0
    for start, end in sorted(windows):
        start, end = max(start, reach), min(end, duration)
        if end > start:
            covered += end - start
            reach = end
    return covered / duration if duration > 0 else 0.0


def p95s(records: list[RequestRecord]) -> tuple[float, float, int]:
    """``(p95 TTFT s, p95 ITL s, n)`` of completed records (NaN when empty)."""
    ttfts = [r.ttft for r in records if r.ttft is not None]
    gaps = [g for r in records for g in r.itl]
    ttft = float(np.percentile(ttfts, 95)) if ttfts else math.nan
    return ttft, float(np.percentile(gaps, 95)) if gaps else math.nan, len(records)


@dataclass
class SoakLog:
    """What the soak saw (times in seconds from the start of the load)."""

    records: list[tuple[RequestRecord, str]] = field(default_factory=list)
    kills: list[dict] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=lambda: {"clear": 0, "unclear": 0})
    unclear: list[str] = field(default_factory=list)
    rss_mib: list[tuple[float, float, float]] = field(default_factory=list)
    restarts: int | None = None
    rerouted: int | None = None


def tree_rss_mib(pid: int) -> tuple[float, float]:
    """``(frontend RSS, engines' RSS)`` in MiB of the server process ``pid``
    and its children (0 for what has gone)."""
    try:
        root = psutil.Process(pid)
        front = root.memory_info().rss
        kids = sum(c.memory_info().rss for c in root.children(recursive=True))
    except psutil.Error:
        return 0.0, 0.0
    return front / 2**20, kids / 2**20


async def send_load(client: httpx.AsyncClient, url: str, model: str, args, log: SoakLog,
                    t0: float) -> None:  # fmt: skip
    """The CPU mix at ``args.rate`` req/s for ``args.duration`` s, each
    request awaited up to ``args.request_timeout`` s."""
    n = max(1, int(args.rate * args.duration * 1.5) + 10)
    reqs = make_mix(n, PromptMaker(seed=args.seed), parse_mix(args.mix), seed=args.seed)
    offsets = arrival_offsets(n, args.rate, seed=args.seed)

    async def one(i: int) -> None:
        req = reqs[i]
        rec = RequestRecord(i, req.tag, req.prompt_len, req.output_len, float(offsets[i]))
        payload = build_payload("completions", model, req.prompt, req.output_len,
                                ignore_eos=True)  # fmt: skip
        rec.sent = time.monotonic() - t0
        try:
            await asyncio.wait_for(stream_request(client, f"{url}/v1/completions", payload,
                                                  "completions", rec), args.request_timeout)
            log.records.append((rec, fate(rec, False)))
        except asyncio.TimeoutError:
            log.records.append((rec, fate(rec, True, args.request_timeout, args.stall)))

    tasks = []
    for i, offset in enumerate(offsets):
        if offset >= args.duration:
            break
        await asyncio.sleep(max(0.0, t0 + offset - time.monotonic()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)


async def send_malformed(client: httpx.AsyncClient, url: str, args, log: SoakLog,
                         stop: asyncio.Event) -> None:  # fmt: skip
    """One body of :data:`MALFORMED` every ``args.malformed_every`` s, in turn."""
    i = 0
    while not stop.is_set():
        name, route, body = MALFORMED[i % len(MALFORMED)]
        i += 1
        try:
            resp = await client.post(f"{url}{route}", content=body, timeout=30.0,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
            ok = clear_error(resp.status_code, resp.content)
            detail = f"{name}: HTTP {resp.status_code} {resp.content[:120]!r}"
        except httpx.HTTPError as e:
            ok, detail = False, f"{name}: {type(e).__name__} {e}"
        log.malformed["clear" if ok else "unclear"] += 1
        if not ok:
            log.unclear.append(detail)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.malformed_every)


async def kill_engines(client: httpx.AsyncClient, url: str, args, log: SoakLog, t0: float,
                       stop: asyncio.Event) -> None:  # fmt: skip
    """SIGKILL a random live engine (its pid from ``GET /stats``) every
    ``args.kill_every`` seconds."""
    rng = random.Random(args.seed)
    lo, hi = args.kill_every
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(lo, hi))
        if stop.is_set():
            return
        try:
            engines = (await client.get(f"{url}/stats", timeout=10.0)).json().get("engines", [])
        except (httpx.HTTPError, ValueError):
            engines = []
        pids = [(e["index"], e["engine_pid"]) for e in engines
                if e.get("alive") and e.get("engine_pid")]
        if not pids:
            log.kills.append({"time": time.monotonic() - t0, "engine": None})
            continue
        index, pid = rng.choice(pids)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        log.kills.append({"time": time.monotonic() - t0, "engine": index, "pid": pid})


async def sample_rss(pid: int, log: SoakLog, t0: float, stop: asyncio.Event) -> None:
    """The server tree's RSS every 10 s."""
    while not stop.is_set():
        front, engines = tree_rss_mib(pid)
        log.rss_mib.append((time.monotonic() - t0, front, engines))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 10.0)


async def soak(url: str, server_pid: int, args) -> SoakLog:
    """Run the load, the kills, the malformed requests and the RSS samples together."""
    log = SoakLog()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        stop = asyncio.Event()
        t0 = time.monotonic()
        side = [asyncio.create_task(c) for c in (
            send_malformed(client, url, args, log, stop),
            kill_engines(client, url, args, log, t0, stop),
            sample_rss(server_pid, log, t0, stop))]  # fmt: skip
        await send_load(client, url, model, args, log, t0)
        stop.set()
        await asyncio.gather(*side)
        with contextlib.suppress(httpx.HTTPError, ValueError):
            stats = (await client.get(f"{url}/stats", timeout=10.0)).json()
            log.restarts = sum(e.get("num_restarts") or 0 for e in stats.get("engines", []))
            log.rerouted = (stats.get("router") or {}).get("rerouted")
    return log


def report(log: SoakLog, args) -> str:
    """The soak's table (Markdown)."""
    counts = {f: sum(1 for _, x in log.records if x == f) for f in FATES}
    windows = [(k["time"], k["time"] + args.kill_window)
               for k in log.kills if k["engine"] is not None]
    done = [r for r, x in log.records if x == "completed"]
    quiet = [r for r in done if not touches(r.sent, r.sent + (r.e2e or 0.0), windows)]
    noisy = [r for r in done if touches(r.sent, r.sent + (r.e2e or 0.0), windows)]

    def rss(first: bool) -> str:
        if not log.rss_mib:
            return "-"
        edge = log.rss_mib[0][0] + 60 if first else log.rss_mib[-1][0] - 60
        pick = [s for s in log.rss_mib if (s[0] <= edge if first else s[0] >= edge)]
        if not pick:
            return "-"
        return (f"{np.median([s[1] for s in pick]):.0f} / "
                f"{np.median([s[2] for s in pick]):.0f} MiB")  # fmt: skip

    def p95_cell(recs: list[RequestRecord]) -> str:
        ttft, itl, n = p95s(recs)
        return f"{ttft:.2f} s / {itl * 1e3:.0f} ms ({n} requests)"

    rows = [
        ("requests sent", len(log.records)),
        *((f"  {f}", counts[f]) for f in FATES),
        ("engine kills", sum(1 for k in log.kills if k["engine"] is not None)),
        ("engine restarts (server's count)", "-" if log.restarts is None else log.restarts),
        ("requests re-routed before their first token",
         "-" if log.rerouted is None else log.rerouted),
        ("malformed requests sent", sum(log.malformed.values())),
        ("  answered with a clear 4xx", log.malformed["clear"]),
        ("  answered otherwise", log.malformed["unclear"]),
        ("RSS frontend / engines (sum), first minute (median)", rss(True)),
        ("RSS frontend / engines (sum), last minute (median)", rss(False)),
        ("p95 TTFT / ITL, outside kill windows", p95_cell(quiet)),
        ("p95 TTFT / ITL, touching a kill window", p95_cell(noisy)),
    ]
    lines = ["| | |", "|---|---:|", *(f"| {k} | {v} |" for k, v in rows)]
    covered = window_share(windows, args.duration)
    if covered > 0.5:
        lines += ["", f"Kill windows cover {covered:.0%} of the run: the 'outside' p95s "
                  "rest on few requests (lengthen --kill-every or shorten --kill-window)."]
    if log.unclear:
        lines += ["", "Malformed requests not answered with a clear 4xx (first 5):",
                  *(f"- {u}" for u in log.unclear[:5])]  # fmt: skip
    failed = Counter(((r.error or "")[:100], r.num_chunks > 0)
                     for r, x in log.records if x == "failed")
    if failed:
        lines += ["", "Failed, by error:",
                  *(f"- {n} × {err} ({'after' if streamed else 'before'} its first token)"
                    for (err, streamed), n in failed.most_common())]  # fmt: skip
    lost = [r for r, x in log.records if x in ("lost", "hung")]
    if lost:
        lines += ["", "Lost or hung (first 5):",
                  *(f"- #{r.index} sent {r.sent:.1f} s: {r.error}" for r in lost[:5])]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The soak's options (see the module docstring).

    Raises:
        SystemExit: a bad option (argparse's usage error naming it).
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--rate", type=float, required=True,
                   help="load in requests/s (80%% of the server's capacity on the mix)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--mix", default=CPU_MIX, help="workload classes (bench serve --mix)")
    p.add_argument("--kill-every", default="60-90", help="seconds between engine kills, LO-HI")
    p.add_argument("--kill-window", type=float, default=30.0,
                   help="seconds after a kill that count as its window for the p95s")
    p.add_argument("--malformed-every", type=float, default=1.0,
                   help="seconds between malformed requests")
    p.add_argument("--request-timeout", type=float, default=180.0,
                   help="seconds after which a request counts as slow or hung")
    p.add_argument("--stall", type=float, default=30.0,
                   help="a timed-out request is slow, not hung, if its last token "
                        "came fewer seconds than this before the timeout")
    p.add_argument("--serve-args", default="--num-threads 1",
                   help="more paternoster serve flags (dp 2 and --restart-engine are given)")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench-results/chaos_soak"),
                   help="folder for the server log and soak.json")
    args = p.parse_args(argv)
    try:
        lo, hi = (float(x) for x in args.kill_every.split("-"))
    except ValueError:
        p.error(f"--kill-every must be LO-HI seconds, got {args.kill_every!r}")
    if not 0 < lo <= hi:
        p.error(f"--kill-every needs 0 < LO <= HI, got {args.kill_every!r}")
    args.kill_every = (lo, hi)
    for name in ("rate", "duration", "malformed_every", "request_timeout", "stall"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.kill_window < 0:
        p.error("--kill-window must be >= 0")
    try:
        parse_mix(args.mix)
    except ValueError as e:
        p.error(f"--mix: {e}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Start the server, soak it, print the table; exit 1 when a request was
    hung or lost or a malformed one got no clear 4xx."""
    args = parse_args(argv)
    port = free_port()
    cmd = [paternoster_cli(), "serve", "--port", str(port),
           "--data-parallel-size", "2", "--restart-engine", *args.serve_args.split()]
    args.out.mkdir(parents=True, exist_ok=True)
    with running_server(cmd, port, args.out / "server.log", args.startup_timeout) as url:
        pid = _server_pid(port)
        log = asyncio.run(soak(url, pid, args))
    table = report(log, args)
    print(table)
    (args.out / "soak.json").write_text(json.dumps({
        "args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()},
        "kills": log.kills, "malformed": log.malformed, "rss_mib": log.rss_mib,
        "restarts": log.restarts, "rerouted": log.rerouted,
        "requests": [{**asdict(r), "fate": x} for r, x in log.records]}, indent=1))  # fmt: skip
    bad = any(x in ("hung", "lost") for _, x in log.records) or log.malformed["unclear"]
    return 1 if bad else 0


def _server_pid(port: int) -> int:
    """The pid of the process listening on ``port`` (the frontend)."""
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    raise RuntimeError(f"no process listens on port {port}")


if __name__ == "__main__":
    sys.exit(main())
