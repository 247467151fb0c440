"""Graceful shutdown of ``paternoster serve``: on SIGTERM/Ctrl-C stop accepting
requests, let the in-flight ones finish for up to ``--shutdown-timeout``
seconds, then end the rest with an error; a second Ctrl-C ends them at once."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from typing import Any

logger = logging.getLogger("paternoster.server")


def graceful_server(app: Any, client: Any, args: argparse.Namespace) -> Any:
    """A uvicorn server whose SIGTERM/SIGINT drain the engine client first:
    refuse new requests, wait up to ``--shutdown-timeout`` seconds for the
    in-flight ones, then end the rest with an error."""
    import uvicorn

    drain_s = args.shutdown_timeout

    class GracefulServer(uvicorn.Server):
        """uvicorn's server with the drain on the first exit signal."""

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

