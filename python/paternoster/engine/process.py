"""The engine process: an EngineCore behind two ZeroMQ sockets.

Run as ``python -m paternoster.engine.process --input ADDR --output ADDR
--parent-pid PID`` (the frontend's :class:`~paternoster.frontend.engine_client.EngineClient`
does this). The frontend binds both sockets; this process connects.

Protocol: the typed messages of :mod:`paternoster.engine.messages` (``ToEngine``
in, ``FromEngine`` out; docs/protocol.md, "Engine link"). Over ``tcp://``
every socket is a CURVE client with the keys the frontend made for this engine
(:mod:`paternoster.engine.curve`; a local child reads them from
``PATERNOSTER_ENGINE_CURVE_KEYS``); a tcp address without keys is refused.
``Config`` comes first; when ``PATERNOSTER_ENGINE_TOKEN`` is set, a ``Config``
whose token differs is dropped. Then ``Ready`` (or ``StartupError`` and exit 1); one
``Outputs`` per step that produced outputs or ran a forward pass (plus the
final outputs of aborted or rejected requests), carrying the stats snapshot
taken just before it is sent (about 2 µs a step); a ``Heartbeat`` every
``heartbeat_interval`` seconds from a thread of its own on a second PUSH
socket, so a step longer than the frontend's stall timeout does not make a
healthy engine look stalled; ``Fatal`` when ``step()`` raised (exit 1).

A rejected ``Add`` (undecodable, or ``EngineCore.add_request`` raised
``ValueError``) becomes an output with ``finish_reason="error"`` and the
message in ``error``.

This module starts the process and does the handshake; the loop that serves
the link once the engine is up is :class:`~paternoster.engine.engine_loop.EngineLoop`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from typing import TYPE_CHECKING

import zmq

from paternoster.engine.codec import CodecError, MessageCodec, PullQueue, PushQueue
from paternoster.engine.cpu_threads import ThreadChoice, apply_threads, resolve_threads
from paternoster.engine.curve import CURVE_KEYS_ENV, EngineKeys, is_tcp, require_curve
from paternoster.engine.engine_loop import DEFAULT_HEARTBEAT_INTERVAL, EngineLoop
from paternoster.engine.messages import (
    Config,
    Fatal,
    FromEngine,
    Ready,
    Shutdown,
    StartupError,
    ToEngine,
)

if TYPE_CHECKING:
    from paternoster.config import EngineConfig

logger = logging.getLogger("paternoster.engine")

DEFAULT_ENGINE_CLS = "paternoster.engine.core:EngineCore"
CONFIG_TIMEOUT_S = 60.0
TOKEN_ENV = "PATERNOSTER_ENGINE_TOKEN"


def load_engine_cls(path: str) -> type:
    """Import ``"package.module:ClassName"`` and return the class.

    Raises:
        ValueError: ``path`` has no ``:``.
        ImportError, AttributeError: the module or class does not exist.
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise ValueError(f"engine class must look like 'module:Class', got {path!r}")
    return getattr(importlib.import_module(module_name), attr)


def _wait_for_config(inputs: PullQueue, parent_pid: int | None, token: str | None) -> dict:
    """The config of the first ``Config`` message carrying ``token`` (any, when
    ``token`` is None)."""
    deadline = time.monotonic() + CONFIG_TIMEOUT_S
    while time.monotonic() < deadline:
        if parent_pid is not None and os.getppid() != parent_pid:
            raise RuntimeError("frontend process is gone")
        if not inputs.poll(200):
            continue
        try:
            msg = inputs.get()
        except CodecError as e:
            logger.error("dropping malformed frame: %s", e)
            continue
        if isinstance(msg, Config):
            if token is not None and msg.token != token:
                logger.error("dropping a config message without the handshake token")
                continue
            return msg.config
        if isinstance(msg, Shutdown) and token is None:
            raise RuntimeError("shut down before start")  # with a token: wait for the config
    raise RuntimeError(f"no config message within {CONFIG_TIMEOUT_S:.0f} s")


def run_engine(
    input_addr: str,
    output_addr: str,
    parent_pid: int | None = None,
    engine_cls: str = DEFAULT_ENGINE_CLS,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    token: str | None = None,
    keys: EngineKeys | None = None,
) -> int:
    """Connect, receive the config, build the engine, and serve until shutdown.

    Args:
        input_addr: ZeroMQ address the frontend PUSHes to (we PULL).
        output_addr: ZeroMQ address the frontend PULLs from (we PUSH).
        parent_pid: exit when our parent is no longer this pid; ``None`` = never.
        engine_cls: ``"module:Class"`` of the engine (tests pass a fake).
        heartbeat_interval: seconds between heartbeats.
        token: the handshake token; ``None``: ``PATERNOSTER_ENGINE_TOKEN``
            (a local child), unset meaning none.
        keys: the CURVE keys of a ``tcp://`` link; ``None``:
            ``PATERNOSTER_ENGINE_CURVE_KEYS`` (a local child), unset meaning
            none. Ignored for ``ipc://``.
    Returns:
        Process exit code: 0 on clean shutdown, 1 on a startup or step failure
        (a tcp link without CURVE keys, or without CURVE in this libzmq,
        included: never plain text over tcp).
    """
    try:
        keys = _link_keys(input_addr, output_addr, keys)
    except ValueError as e:
        logger.error("engine failed to start: %s", e)
        return 1
    ctx = zmq.Context()

    def socket(kind: int) -> zmq.Socket:
        sock = ctx.socket(kind)
        if keys is not None:
            keys.apply(sock)
        return sock

    pull = socket(zmq.PULL)
    push = socket(zmq.PUSH)
    pull.connect(input_addr)
    push.connect(output_addr)
    push.setsockopt(zmq.LINGER, 2000)
    push.setsockopt(zmq.SNDTIMEO, 1000)
    inputs = PullQueue(pull, MessageCodec(ToEngine))
    outputs = PushQueue(push, MessageCodec(FromEngine))
    engine = None
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    try:
        try:
            from paternoster.config import EngineConfig

            config = EngineConfig.from_dict(_wait_for_config(inputs, parent_pid, token))
            config = _configure_threads(config)
            engine = load_engine_cls(engine_cls)(config)
        except Exception as e:  # report any startup failure, in words, then exit
            if isinstance(e, ValueError):  # a bad setting or model: its message says it
                logger.error("engine failed to start: %s", e)
                logger.debug("engine startup traceback: %s", traceback.format_exc())
            else:
                logger.error("engine failed to start: %s", traceback.format_exc())
            error = f"{type(e).__name__}: {e}"
            outputs.put(StartupError(error=error, token=token))
            return 1
        outputs.put(Ready(info=dict(engine.info), token=token or ""))
        logger.info("engine ready (pid %d): %s", os.getpid(), engine.info)
        def beat_queue() -> PushQueue:
            sock = socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDTIMEO, 1000)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(output_addr)
            return PushQueue(sock, MessageCodec(FromEngine))

        loop = EngineLoop(engine, inputs, outputs, parent_pid, heartbeat_interval, beat_queue)
        try:
            loop.run()
        except Exception as e:
            logger.error("engine step failed: %s", traceback.format_exc())
            outputs.put(Fatal(error=f"{type(e).__name__}: {e}"))
            return 1
        return 0
    finally:
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                logger.exception("engine shutdown failed")
        pull.close(linger=0)
        push.close(linger=0 if _orphaned(parent_pid) else None)
        ctx.term()
        if _orphaned(parent_pid):
            _remove_ipc_dir(input_addr)


def _link_keys(input_addr: str, output_addr: str,
               keys: EngineKeys | None) -> EngineKeys | None:  # fmt: skip
    """The CURVE keys for these addresses: ``keys`` (else the environment's)
    for ``tcp://``, ``None`` for ``ipc://``.

    Raises:
        ValueError: a tcp address without keys, unreadable keys, or no CURVE
            in this libzmq.
    """
    if not (is_tcp(input_addr) or is_tcp(output_addr)):
        return None
    require_curve()
    if keys is None and os.environ.get(CURVE_KEYS_ENV):
        keys = EngineKeys.from_env(os.environ[CURVE_KEYS_ENV])
    if keys is None:
        raise ValueError("a tcp engine link needs the CURVE keys the frontend made for this "
                         f"engine ({CURVE_KEYS_ENV}); refusing to connect in plain text")
    return keys


def _configure_threads(config: EngineConfig) -> EngineConfig:
    """Resolve ``num_threads`` (0 = auto) for this engine process, pin the
    process when auto leaves a core to the frontend, set torch's intra-op pool
    to that count and its inter-op pool to 1, and log the one line. With
    tensor parallel: every rank's share (``rank_threads``), this process
    being rank 0.

    Returns:
        ``config`` with the resolved ``num_threads`` (>= 1).
    Raises:
        ValueError: ``PATERNOSTER_NUM_THREADS`` is not an int >= 1.
    """
    import dataclasses

    if config.tensor_parallel_size > 1:  # split between the ranks, each on its own cores
        from paternoster.engine.tensor_parallel import plan_ranks, rank0_threads

        config = plan_ranks(config, reserve_frontend=True, pin_rank0=True)
        threads = rank0_threads(config)
    elif config.cpus is not None:  # a data-parallel engine: the frontend chose its cores
        threads = ThreadChoice(num_threads=config.num_threads or len(config.cpus),
                               source="data_parallel", cpus=config.cpus)  # fmt: skip
    else:
        threads = resolve_threads(config.num_threads, reserve_frontend=True)
    threads = apply_threads(threads)
    logger.info("%s", threads.describe())
    return dataclasses.replace(config, num_threads=threads.num_threads)


def _orphaned(parent_pid: int | None) -> bool:
    return parent_pid is not None and os.getppid() != parent_pid


def _remove_ipc_dir(addr: str) -> None:
    """The frontend died without cleaning up: remove its private socket dir."""
    if not addr.startswith("ipc://"):
        return
    folder = os.path.dirname(addr[len("ipc://") :])
    if os.path.basename(folder).startswith("paternoster-"):
        shutil.rmtree(folder, ignore_errors=True)


def die_with_parent() -> None:
    """Ask Linux to SIGTERM us when the parent dies (best effort; the loop also
    checks ``getppid``). Linux sends it when the *thread* that started us
    exits, so start children from a thread that outlives them."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except Exception:  # not fatal: the getppid check remains
        pass


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: parse the addresses and run :func:`run_engine`.

    Returns:
        The process exit code.
    """
    p = argparse.ArgumentParser(description="Paternoster engine process (started by the frontend)")
    p.add_argument("--input", required=True, help="ZeroMQ address to PULL requests from")
    p.add_argument("--output", required=True, help="ZeroMQ address to PUSH outputs to")
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument("--engine-cls", default=DEFAULT_ENGINE_CLS)
    p.add_argument("--heartbeat-interval", type=float, default=DEFAULT_HEARTBEAT_INTERVAL)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    # SIGTERM (also our parent-death signal) unwinds through the cleanup code.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.parent_pid is not None:
        # Ctrl-C in a terminal signals the whole process group, us included: the
        # frontend drains its in-flight requests first, then stops us.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s [engine] %(message)s",
        stream=sys.stderr,
    )
    try:
        return run_engine(
            args.input, args.output, args.parent_pid, args.engine_cls, args.heartbeat_interval
        )
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # cleaned up: a late SIGTERM just ends us


if __name__ == "__main__":
    sys.exit(main())
