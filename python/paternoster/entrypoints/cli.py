"""The ``paternoster`` command: ``paternoster serve [MODEL_DIR] [flags]``,
``paternoster simulate [flags]`` (the model-free scheduler simulator),
``paternoster trace`` (request timelines) and ``paternoster bench serve|capacity``.

Starts the engine process, then the OpenAI-compatible HTTP server. Without
MODEL_DIR it serves the embedded default model (SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from paternoster.entrypoints.engine_args import (
    ENGINE_ARG_NAMES,
    add_engine_args,
    build_engine_config,
    resolve_model_dir,
)

logger = logging.getLogger("paternoster.server")


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``paternoster`` command."""
    parser = argparse.ArgumentParser(prog="paternoster", description="Paternoster LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    serve.add_argument(
        "model", nargs="?", default=None, metavar="MODEL_DIR",
        help="HF model directory (default: the embedded SmolLM2-135M-Instruct)",
    )  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    add_engine_args(serve)
    g = serve.add_argument_group("frontend")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--engine-startup-timeout", type=float, default=600.0,
        help="seconds to wait for the engine to load the model",
    )  # fmt: skip
    g.add_argument(
        "--engine-stall-timeout", type=float, default=30.0,
        help="seconds without a heartbeat before the engine is declared dead",
    )  # fmt: skip
    g.add_argument(
        "--chat-template", default=None, metavar="FILE",
        help="Jinja chat template file replacing the model's own (or supplying a missing one)",
    )  # fmt: skip
    g.add_argument("--engine-cls", default=None, help=argparse.SUPPRESS)  # tests: a fake engine
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


async def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted.

    Args:
        args: parsed ``serve`` arguments.
    Returns:
        Exit code: 0 after a clean stop, 1 when the model or engine failed to load.
    """
    import uvicorn

    from paternoster.engine.process import DEFAULT_ENGINE_CLS
    from paternoster.entrypoints.engine_client import EngineClient, EngineStartupError
    from paternoster.entrypoints.openai.api_server import build_app

    model_dir = resolve_model_dir(args.model)
    if not os.path.isdir(model_dir):
        logger.error("cannot load model %s: not a directory", model_dir)
        return 1
    chat_template = None
    if args.chat_template is not None:
        from paternoster.entrypoints.chat_utils import load_chat_template

        try:
            chat_template = load_chat_template(args.chat_template)
        except ValueError as e:
            logger.error("%s", e)
            return 1
    try:
        config = build_engine_config(model_dir, **{k: getattr(args, k) for k in ENGINE_ARG_NAMES})
    except ValueError as e:
        logger.error("%s", e)
        return 1
    client = EngineClient(
        config,
        engine_cls=args.engine_cls or DEFAULT_ENGINE_CLS,
        startup_timeout=args.engine_startup_timeout,
        stall_timeout=args.engine_stall_timeout,
        log_level=args.log_level.upper(),
    )
    # Load the tokenizer while the engine process loads the model.
    starting = asyncio.create_task(client.start())
    try:
        tokenizer = await asyncio.to_thread(_load_tokenizer, model_dir)
        info = await starting
    except EngineStartupError as e:
        logger.error("%s", e)
        await client.shutdown()
        return 1
    except Exception as e:
        logger.error("cannot load model %s: %s: %s", model_dir, type(e).__name__, e)
        starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
        await client.shutdown()
        return 1
    try:
        name = args.served_model_name or info["model"]
        app = build_app(client, tokenizer, name, chat_template=chat_template)
        logger.info(
            "model %s from %s: max_model_len=%d, %d KV blocks of %d tokens",
            name, info.get("model_dir"), app.state.serving.max_model_len,
            info.get("num_kv_blocks"), info.get("block_size"),
        )  # fmt: skip
        logger.info("serving on http://%s:%d/v1", args.host, args.port)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=args.host,
                port=args.port,
                log_level=args.log_level,
                timeout_graceful_shutdown=5,
            )  # fmt: skip
        )
        await server.serve()
        return 0
    finally:
        await client.shutdown()


def _load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


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
