"""The ``paternoster`` command: ``paternoster serve [MODEL] [flags]``,
``paternoster simulate [flags]`` (the model-free scheduler simulator),
``paternoster trace`` (request timelines) and ``paternoster bench serve|capacity``.

Starts the engine process, then the OpenAI-compatible HTTP server. Without
MODEL (an HF model directory or a .gguf file) it serves the embedded default
model (SmolLM2-135M-Instruct).

SIGTERM or Ctrl-C shut the server down gracefully: it stops accepting
requests (/health turns 503), lets in-flight requests finish for up to
``--shutdown-timeout`` seconds, ends the rest with an error (an SSE error
event and ``[DONE]`` for streams), stops the engine and exits 0. A second
Ctrl-C ends the in-flight requests at once.

The flags of ``serve`` are in serve_args.py, its start-up in serve.py and its
shutdown in graceful.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from paternoster.entrypoints.serve import serve
from paternoster.entrypoints.serve_args import add_serve_args


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``paternoster`` command."""
    parser = argparse.ArgumentParser(prog="paternoster", description="Paternoster LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="serve a model over the OpenAI HTTP API"))
    from paternoster.simulate.cli import add_simulate_args

    add_simulate_args(
        sub.add_parser("simulate", help="run scheduler policies on a trace with a cost model")
    )
    from paternoster.metrics.trace_cli import add_trace_args

    add_trace_args(
        sub.add_parser(
            "trace", help="export request timelines as Chrome/Perfetto trace JSON and a Gantt PNG"
        )
    )
    from paternoster.bench.cli import add_bench_args

    add_bench_args(
        sub.add_parser("bench", help="serving benchmark and capacity finder (any OpenAI endpoint)")
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``paternoster`` console script.

    Returns:
        The process exit code.
    """
    args = make_parser().parse_args(argv)
    if args.command == "simulate":
        from paternoster.simulate.cli import run

        return run(args)
    if args.command == "trace":
        from paternoster.metrics.trace_cli import run as run_trace

        return run_trace(args)
    if args.command == "bench":
        from paternoster.bench.cli import run as run_bench

        return run_bench(args)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [%(name)s] %(message)s",
    )
    # uvicorn re-raises the signal that stopped it once it is done; make SIGTERM
    # unwind like Ctrl-C so that the engine process and sockets are cleaned up.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 0


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
