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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from paternoster.entrypoints.engine_args import (
    ENGINE_ARG_NAMES,
    add_engine_args,
    build_engine_config,
    parse_bytes,
    positive_int,
    resolve_model_dir,
)

logger = logging.getLogger("paternoster.server")


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``paternoster`` command."""
    parser = argparse.ArgumentParser(prog="paternoster", description="Paternoster LLM server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    serve.add_argument(
        "model", nargs="?", default=None, metavar="MODEL",
        help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
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
        "--engine-stall-timeout", type=float, default=10.0,
        help="seconds without a heartbeat before the engine is reported stalled: /health "
        "answers 503 and new requests are refused until heartbeats resume (the engine "
        "beats from its own thread, also during a long step)",
    )  # fmt: skip
    g.add_argument(
        "--engine-step-timeout", type=float, default=600.0,
        help="seconds one engine step, or one stall, may last before the engine is declared "
        "dead and killed (a long prompt prefilled in one step can take minutes on a CPU)",
    )  # fmt: skip
    g.add_argument(
        "--chat-template", default=None, metavar="FILE",
        help="Jinja chat template file replacing the model's own (or supplying a missing one)",
    )  # fmt: skip
    g.add_argument(
        "--trust-request-chat-template", action="store_true",
        help="accept a chat_template in requests (it is Jinja code the server runs; off by "
        "default, as in vLLM)",
    )  # fmt: skip
    g.add_argument(
        "--tool-call-parser", default=None, metavar="NAME",
        help="read tool calls out of chat output in this model family's format, for "
        "tool_choice auto (built-in: hermes (Qwen2.5/Qwen3/Hermes), qwen3_coder, llama3_json, "
        "mistral, pythonic; more from the entry-point group paternoster.tool_parsers)",
    )  # fmt: skip
    g.add_argument(
        "--reasoning-parser", default=None, metavar="NAME",
        help="split chat output into reasoning_content and the answer (built-in: deepseek_r1, "
        "qwen3, gpt_oss; more from the entry-point group paternoster.reasoning_parsers)",
    )  # fmt: skip
    g.add_argument(
        "--enable-auto-tool-choice", action="store_true",
        help="vLLM's switch, accepted: tool_choice auto works whenever --tool-call-parser is set",
    )  # fmt: skip
    g.add_argument(
        "--zmq-address", default=None, metavar="ENDPOINT",
        help="ZeroMQ endpoint of the msgpack client protocol (docs/protocol.md), e.g. "
             "tcp://127.0.0.1:5555; default ipc://<tmp>/paternoster-<port>.ipc; 'none' turns "
             "it off",
    )  # fmt: skip
    # tests: slow-client handling with small queues and short timeouts
    g.add_argument("--zmq-sndhwm", type=positive_int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--zmq-slow-client-timeout", type=_positive_float, default=None,
                   help=argparse.SUPPRESS)  # fmt: skip
    g.add_argument("--engine-cls", default=None, help=argparse.SUPPRESS)  # tests: a fake engine
    _add_hardening_args(serve)
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




def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _add_hardening_args(parser: argparse.ArgumentParser) -> None:
    """Security, overload and shutdown flags of ``serve`` (docs/errors.md)."""
    from paternoster.entrypoints.openai.api_server import DEFAULT_MAX_STOP
    from paternoster.sampling_params import MAX_N

    g = parser.add_argument_group("limits, security and shutdown")
    g.add_argument(
        "--api-key", default=os.environ.get("PATERNOSTER_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on every route but /health, /version "
             "and /metrics (default: $PATERNOSTER_API_KEY; none when unset)",
    )  # fmt: skip
    g.add_argument(
        "--max-request-body-bytes", type=parse_bytes, default=16 * 1024**2, metavar="BYTES",
        help="larger request bodies get 413 (default 16MiB)",
    )  # fmt: skip
    g.add_argument("--max-n", type=positive_int, default=MAX_N,
                   help=f"largest n per request (at most {MAX_N})")  # fmt: skip
    g.add_argument("--max-stop-sequences", type=int, default=DEFAULT_MAX_STOP,
                   help="most stop strings per request")  # fmt: skip
    g.add_argument(
        "--max-waiting-requests", type=positive_int, default=None, metavar="N",
        help="at most N requests waiting for their first token; beyond, 503 with "
             "Retry-After (default: unbounded)",
    )  # fmt: skip
    g.add_argument(
        "--max-waiting-tokens", type=positive_int, default=None, metavar="N",
        help="at most N prompt tokens waiting; beyond, 503 with Retry-After (default: unbounded)",
    )  # fmt: skip
    g.add_argument(
        "--queue-timeout", type=_positive_float, default=None, metavar="S",
        help="abort a request with 503 when it waited S seconds for its first token",
    )  # fmt: skip
    scale = parser.add_argument_group("scale-out")
    scale.add_argument(
        "--data-parallel-size", "-dp", type=positive_int, default=1, metavar="N",
        help="run N engine processes (data parallel), each with its own KV cache and its "
             "own cores (CPU: pinned to disjoint cores; --num-threads is then per engine) "
             "or GPU (CUDA: engine i gets GPU i), behind this one server; requests go "
             "where their prompt prefix is cached, else to the least loaded engine (default 1)",
    )  # fmt: skip
    scale.add_argument(
        "--distributed-executor-backend", choices=("mp", "ray"), default="mp",
        help="mp: engines are local processes (default); ray: engines are Ray actors on an "
             "existing Ray cluster (`ray start --head`, `ray start --address HEAD:6379`), "
             "one placement-group bundle of --num-threads CPUs (default 1) each, spread "
             "over the nodes, linked to this server over ZeroMQ tcp (README: Deployment)",
    )  # fmt: skip
    scale.add_argument(
        "--ray-address", default=None, metavar="HOST:PORT",
        help="the Ray cluster to join with --distributed-executor-backend ray "
             "(default: RAY_ADDRESS, else the cluster running on this node)",
    )  # fmt: skip
    g.add_argument(
        "--restart-engine", action="store_true",
        help="start a new engine process when the engine dies or stalls (in-flight "
             "requests still fail; /health recovers once it is ready)",
    )  # fmt: skip
    g.add_argument(
        "--shutdown-timeout", type=_positive_float, default=10.0, metavar="S",
        help="on SIGTERM/Ctrl-C, seconds in-flight requests may take to finish (default 10)",
    )  # fmt: skip


def _plugin(get: Callable[[str], type], name: str | None, flag: str) -> type | None:
    """The plugin class a flag names (``None`` when the flag is unset).

    Raises:
        ValueError: an unknown name, the message starting with the flag.
    """
    if name is None:
        return None
    try:
        return get(name)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


async def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted.

    Args:
        args: parsed ``serve`` arguments.
    Returns:
        Exit code: 0 after a clean stop, 1 when the model or engine failed to load.
    """
    from paternoster.engine.cpu_threads import format_cpu_list, limit_frontend_torch_threads
    from paternoster.engine.process import DEFAULT_ENGINE_CLS
    from paternoster.entrypoints.openai.api_server import ServerLimits, build_app
    from paternoster.frontend.data_parallel import DataParallelClient
    from paternoster.frontend.errors import EngineStartupError
    from paternoster.model.gguf import is_gguf

    model_dir = resolve_model_dir(args.model)
    if not os.path.exists(model_dir):
        logger.error("cannot load model %s: no such file or directory", model_dir)
        return 1
    if not (os.path.isdir(model_dir) or is_gguf(model_dir)):
        logger.error("cannot load model %s: not a directory or a .gguf file", model_dir)
        return 1
    chat_template = None
    if args.chat_template is not None:
        from paternoster.frontend.chat import load_chat_template

        try:
            chat_template = load_chat_template(args.chat_template)
        except ValueError as e:
            logger.error("%s", e)
            return 1
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        logger.error("--enable-auto-tool-choice needs --tool-call-parser NAME")
        return 1
    from paternoster.reasoning_parsers import get_reasoning_parser
    from paternoster.tool_parsers import get_tool_parser

    try:
        tool_parser = _plugin(get_tool_parser, args.tool_call_parser, "--tool-call-parser")
        reasoning_parser = _plugin(get_reasoning_parser, args.reasoning_parser,
                                   "--reasoning-parser")  # fmt: skip
    except ValueError as e:
        logger.error("%s", e)
        return 1
    try:
        check_http_port(args.host, args.port)
        if args.zmq_address not in ("none", "off"):
            from paternoster.entrypoints.zmq_address import check_address, default_zmq_address

            check_address(args.zmq_address or default_zmq_address(args.port))
        config = build_engine_config(model_dir, **{k: getattr(args, k) for k in ENGINE_ARG_NAMES})
        limits = ServerLimits(
            api_key=args.api_key,
            max_body_bytes=args.max_request_body_bytes,
            max_n=args.max_n,
            max_stop=args.max_stop_sequences,
        )
        client = DataParallelClient.create(
            config,
            args.data_parallel_size,
            engine_cls=args.engine_cls or DEFAULT_ENGINE_CLS,
            startup_timeout=args.engine_startup_timeout,
            stall_timeout=args.engine_stall_timeout,
            step_timeout=args.engine_step_timeout,
            log_level=args.log_level.upper(),
            max_waiting_requests=args.max_waiting_requests,
            max_waiting_tokens=args.max_waiting_tokens,
            queue_timeout=args.queue_timeout,
            restart_engine=args.restart_engine,
            distributed_executor_backend=args.distributed_executor_backend,
            ray_address=args.ray_address,
        )
    except ValueError as e:
        logger.error("%s", e)
        return 1
    if client.num_engines > 1:
        for i, c in enumerate(client.engines):
            where = (f"CPUs {format_cpu_list(c.supervisor.config.cpus)}"
                     if c.supervisor.config.cpus
                     else "a Ray actor" if client.launcher is not None
                     else str(c.supervisor.env or "unpinned"))  # fmt: skip
            logger.info("data parallel: engine %d of %d on %s", i, client.num_engines, where)
    # Load the tokenizer while the engine process loads the model.
    starting = asyncio.create_task(client.start())
    try:
        tokenizer = await asyncio.to_thread(_load_tokenizer, model_dir)
        if reasoning_parser is not None:  # one that cannot read this model refuses here
            try:
                reasoning_parser(tokenizer)
            except ValueError as e:
                raise ValueError(f"--reasoning-parser {args.reasoning_parser}: {e}") from None
        # Loading the tokenizer imports torch: keep its pools here at 1 thread,
        # the cores are the engine process's.
        limit_frontend_torch_threads()
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
    zmq_server = None
    try:
        name = args.served_model_name or info["model"]
        app = build_app(client, tokenizer, name, chat_template=chat_template, limits=limits,
                        tool_parser=tool_parser, reasoning_parser=reasoning_parser,
                        trust_request_chat_template=args.trust_request_chat_template)  # fmt: skip
        logger.info(
            "model %s from %s: max_model_len=%d, %d KV blocks of %d tokens",
            name, info.get("model_dir"), app.state.serving.max_model_len,
            info.get("num_kv_blocks"), info.get("block_size"),
        )  # fmt: skip
        zmq_server = await _start_zmq_server(app.state.frontend, args)
        if zmq_server is None and args.zmq_address not in ("none", "off"):
            return 1
        logger.info("serving on http://%s:%d/v1", args.host, args.port)
        server = _graceful_server(app, client, args)
        await server.serve()
        if server.drain_task is not None:  # uvicorn is done with HTTP; ZeroMQ requests
            await server.drain_task  # may still run: give them the rest of the drain
        if zmq_server is not None:
            await zmq_server.wait_idle(timeout=2.0)  # their finals, after the drain
        return 0
    finally:
        if zmq_server is not None:
            await zmq_server.close()
        await client.shutdown()


async def _start_zmq_server(frontend: Any, args: argparse.Namespace) -> Any:
    """Bind the client protocol's ROUTER socket (``--zmq-address``).

    Returns:
        The started :class:`ZmqServer`, or ``None`` when it is off or the
        address cannot be bound (logged).
    """
    from paternoster.entrypoints.zmq_address import default_zmq_address
    from paternoster.entrypoints.zmq_server import ZmqServer

    if args.zmq_address in ("none", "off"):
        logger.info("client protocol (ZeroMQ/msgpack) is off (--zmq-address none)")
        return None
    address = args.zmq_address or default_zmq_address(args.port)
    tuning = {}
    if args.zmq_sndhwm is not None:
        tuning["sndhwm"] = args.zmq_sndhwm
    if args.zmq_slow_client_timeout is not None:
        tuning["slow_client_timeout"] = args.zmq_slow_client_timeout
    server = ZmqServer(
        frontend, address, api_key=args.api_key, max_message_bytes=args.max_request_body_bytes,
        **tuning,
    )  # fmt: skip
    try:
        bound = await server.start()
    except Exception as e:
        logger.error("cannot listen on --zmq-address %s: %s", address, e)
        return None
    logger.info("client protocol (ZeroMQ/msgpack) on %s", bound)
    return server


def _graceful_server(app: Any, client: Any, args: argparse.Namespace) -> Any:
    """A uvicorn server whose SIGTERM/SIGINT drain the engine client first:
    refuse new requests, wait up to ``--shutdown-timeout`` seconds for the
    in-flight ones, then end the rest with an error."""
    import uvicorn

    drain_s = args.shutdown_timeout

    class GracefulServer(uvicorn.Server):
        drain_task: asyncio.Task | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            loop = getattr(self, "loop", None)
            if loop is None:  # still starting up: nothing is in flight
                return
            if first:
                logger.info("shutting down: draining %d in-flight requests", client.num_in_flight)
                loop.call_soon_threadsafe(self._start_drain)
            elif self.force_exit:
                loop.call_soon_threadsafe(client.fail_in_flight, "server is shutting down")

        def _start_drain(self) -> None:
            self.drain_task = asyncio.ensure_future(_drain(client, drain_s))

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            # uvicorn re-raises the signal that stopped it once HTTP is done, which
            # would cut the ZeroMQ requests' drain short; serve() returns instead and
            # the caller finishes the drain. A second signal then interrupts as usual.
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

        async def startup(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # Past the drain, streams get their error events; then uvicorn cancels.
        timeout_graceful_shutdown=int(drain_s) + 3,
    )
    return GracefulServer(config)


def check_http_port(host: str, port: int) -> None:
    """Refuse an HTTP address that cannot be bound before the model is loaded
    (uvicorn would find out only after minutes of loading).

    Raises:
        ValueError: the host does not resolve, or binding fails (in use,
            not this machine's address, a privileged port).
    """
    import socket

    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r} does not resolve: {e}") from e
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        probe.bind(sockaddr)
    except OSError as e:
        raise ValueError(f"cannot serve HTTP on {host}:{port}: {e.strerror or e} "
                         f"(another server on that port?)") from e
    finally:
        probe.close()


async def _drain(client: Any, timeout_s: float) -> None:
    """Refuse new requests, wait up to ``timeout_s`` seconds for the in-flight
    ones to finish, then end those left with an error."""
    client.stop_accepting("server is shutting down")
    deadline = asyncio.get_running_loop().time() + timeout_s
    while client.num_in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    if client.num_in_flight:
        logger.warning("shutdown timeout: ending %d in-flight requests", client.num_in_flight)
        client.fail_in_flight("server is shutting down")


def _load_tokenizer(model_dir: str) -> Any:
    from paternoster.model.loader import load_tokenizer

    return load_tokenizer(model_dir)


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
