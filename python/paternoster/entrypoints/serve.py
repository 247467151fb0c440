"""``paternoster serve``: check the flags, start the engine process(es) while
loading the tokenizer, then serve the OpenAI-compatible HTTP API (and the
ZeroMQ/msgpack client protocol) until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from paternoster.entrypoints.engine_args import (
    ENGINE_ARG_NAMES,
    build_engine_config,
    resolve_model_dir,
)
from paternoster.entrypoints.graceful import graceful_server

logger = logging.getLogger("paternoster.server")


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
    from paternoster.entrypoints.openai.api_server import build_app
    from paternoster.entrypoints.openai.guard import ServerLimits
    from paternoster.frontend.data_parallel import DataParallelClient
    from paternoster.frontend.errors import EngineStartupError
    from paternoster.model.gguf_file import is_gguf

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
            metrics_max_tenants=args.metrics_max_tenants,
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
            routing=args.data_parallel_routing,
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
        server = graceful_server(app, client, args)
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


def _load_tokenizer(model_dir: str) -> Any:
    from paternoster.model.loader import load_tokenizer

    return load_tokenizer(model_dir)
