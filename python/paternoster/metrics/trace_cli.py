"""``paternoster trace``: a server's request timeline as a Chrome/Perfetto trace and a Gantt PNG.

Fetches ``GET /debug/timeline?format=snapshot`` from a running ``paternoster
serve`` started with ``--timeline-size N`` (or reads a snapshot saved with
``--save-snapshot`` / ``LLM.save_timeline``), then writes the trace JSON (open
it in https://ui.perfetto.dev or chrome://tracing) and, with ``--gantt``, a PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


class TraceFetchError(RuntimeError):
    """The timeline could not be fetched or read (message says why)."""


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``paternoster trace`` flags to ``parser``."""
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"the server's base URL (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--input", default=None, metavar="JSON",
        help="read a saved timeline snapshot instead of asking a server",
    )  # fmt: skip
    parser.add_argument(
        "-o", "--output", default="trace.json", metavar="JSON",
        help="Chrome/Perfetto trace to write (default trace.json)",
    )  # fmt: skip
    parser.add_argument("--gantt", default=None, metavar="PNG", help="also write a Gantt chart")
    parser.add_argument(
        "--gantt-x", choices=["time", "step"], default="time", help="Gantt x axis (time)"
    )
    parser.add_argument(
        "--save-snapshot", default=None, metavar="JSON", help="also write the raw timeline snapshot"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout (s)")


def fetch_timeline(url: str, timeout: float = 30.0, engine: int = 0) -> dict:
    """The timeline snapshot of the server at ``url``.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is ignored).
        timeout: seconds for the HTTP request.
        engine: which data-parallel engine's timeline (0: the first).
    Returns:
        The snapshot (schema in :mod:`paternoster.metrics.timeline`).
    Raises:
        TraceFetchError: the server is unreachable, answered an error (its
            message is included: e.g. timelines are off) or sent no snapshot.
    """
    base = url.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    target = base + "/debug/timeline?format=snapshot" + (f"&engine={engine}" if engine else "")
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        raise TraceFetchError(f"{target}: HTTP {e.code}: {_error_message(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TraceFetchError(f"cannot reach {base}: {reason}") from None
    try:
        snapshot = json.loads(body)
    except ValueError as e:
        raise TraceFetchError(f"{target} did not answer JSON: {e}") from None
    return _checked(snapshot, target)


def _checked(snapshot: object, source: str) -> dict:
    """``snapshot`` if it looks like a timeline snapshot, else TraceFetchError."""
    if not isinstance(snapshot, dict) or not {"requests", "steps", "now"} <= snapshot.keys():
        raise TraceFetchError(f"{source} holds no timeline snapshot")
    return snapshot


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the body itself."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", "replace")[:500] or "no body"


def run(args: argparse.Namespace) -> int:
    """Fetch (or read) the timeline and write the requested files.

    Returns:
        0 on success, 1 when the timeline could not be fetched or read.
    """
    from paternoster.metrics.chrome_trace import write_chrome_trace

    try:
        if args.input is not None:
            try:
                snapshot = _checked(json.loads(Path(args.input).read_text()), args.input)
            except (OSError, ValueError) as e:
                raise TraceFetchError(f"cannot read {args.input}: {e}") from None
        else:
            snapshot = fetch_timeline(args.url, args.timeout)
    except TraceFetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.save_snapshot is not None:
        Path(args.save_snapshot).write_text(json.dumps(snapshot) + "\n")
    write_chrome_trace(snapshot, args.output)
    written = [args.output]
    if args.gantt is not None:
        from paternoster.metrics.gantt import plot_timeline_gantt

        plot_timeline_gantt(snapshot, args.gantt, x=args.gantt_x)
        written.append(args.gantt)
    dropped = snapshot.get("num_steps_dropped") or 0
    print(
        f"{len(snapshot['requests'])} requests, {len(snapshot['steps'])} steps"
        + (f" (older {dropped} steps dropped from the ring buffer)" if dropped else "")
        + f"; wrote {', '.join(map(str, written))}. Open the trace in https://ui.perfetto.dev"
    )
    return 0
