"""Engine supervision: start the engine process, watch it, restart it.

The watchdog (every 50 ms) tells four states apart:

- **ready**: messages (at least the heartbeats, sent every
  ``heartbeat_interval`` from a thread of the engine's own, busy or idle)
  keep arriving.
- **stalled**: nothing arrived for ``stall_timeout`` seconds (a frozen or
  stopped process, e.g. SIGSTOP). Reported at once (``/health`` answers 503,
  new requests are refused); in-flight requests keep waiting; when messages
  arrive again the engine is ready again. A stall longer than
  ``step_timeout`` is a death.
- **dead**: the process exited, sent ``Fatal``, stalled past
  ``step_timeout``, or one step ran past ``step_timeout`` (the heartbeats
  report when the running step began: a long prefill is not a stall, only a
  step longer than this limit is). Every in-flight request fails at once; the
  process is killed.
- **restarting** (``restart_engine``): a dead engine is replaced, retried
  with a backoff of 1, 2, 4 ... 30 s while the new one fails to start.

The config handshake carries a random token (passed to a local child in the
``PATERNOSTER_ENGINE_TOKEN`` environment variable, never on the command line;
to a Ray actor as an argument of its ``run`` call, over Ray's own channel):
the engine ignores a ``Config`` without it and the frontend a ``Ready``
without it, so another process cannot pose as either side. A tcp link adds
ZeroMQ CURVE under that (:mod:`paternoster.engine.curve`): the engine's keys
travel the same way as the token, and a peer without them cannot connect.

Where the engine runs is the :class:`~.launcher.EngineLauncher`'s business:
a local process (default) or a Ray actor on another node; the watchdog sees
both through an :class:`~.launcher.EngineHandle`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from paternoster.config import EngineConfig
from paternoster.engine.messages import Config, Ready, StartupError
from paternoster.frontend.errors import EngineStartupError
from paternoster.frontend.launcher import EngineHandle, EngineLauncher, LocalLauncher
from paternoster.frontend.link import EngineLink

logger = logging.getLogger("paternoster.frontend")

WATCHDOG_PERIOD_S = 0.05


#: Seconds between resends of a restarted engine's Config until it is ready.
CONFIG_RESEND_S = 1.0

class EngineSupervisor:
    """Runs one engine (a process or a Ray actor) behind an :class:`EngineLink`.

    Args:
        config: the engine's configuration (sent in the ``Config`` message).
        link: the bound link the process connects to.
        token: the handshake token.
        on_dead: called once with the reason when the engine dies.
        engine_cls: ``"module:Class"`` the engine process builds.
        startup_timeout: seconds to wait for ``Ready`` (model load included).
        stall_timeout: seconds without any message before the engine is
            reported stalled.
        step_timeout: seconds one step (or one stall) may last before the
            engine is declared dead and killed; ``None``: no limit.
        heartbeat_interval: seconds between the engine's heartbeats.
        log_level: the engine process's log level.
        restart_engine: replace a dead engine with a new process.
        env: environment variables added to the process's (a data-parallel
            engine's ``CUDA_VISIBLE_DEVICES``).
        launcher: starts the engine (default: a :class:`LocalLauncher`).
        index: the engine's data-parallel index (for the launcher).
    Raises:
        ValueError: a timeout <= 0, naming it.
    """

    def __init__(self, config: EngineConfig, link: EngineLink, token: str,
                 on_dead: Callable[[str], None], engine_cls: str, startup_timeout: float,
                 stall_timeout: float, step_timeout: float | None, heartbeat_interval: float,
                 log_level: str, restart_engine: bool,
                 env: dict[str, str] | None = None, launcher: EngineLauncher | None = None,
                 index: int = 0):  # fmt: skip
        for name, value in (("stall_timeout", stall_timeout), ("step_timeout", step_timeout),
                            ("startup_timeout", startup_timeout)):  # fmt: skip
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        self.config = config
        self.link = link
        self.token = token
        self.on_dead = on_dead
        self.engine_cls = engine_cls
        self.startup_timeout = startup_timeout
        self.stall_timeout = stall_timeout
        self.step_timeout = step_timeout
        self.heartbeat_interval = heartbeat_interval
        self.log_level = log_level
        self.restart_engine = restart_engine
        self.env = dict(env or {})
        self.launcher = launcher if launcher is not None else LocalLauncher()
        self.index = index
        self.info: dict = {}
        self.dead_reason: str | None = None
        self.stalled_since: float | None = None  # monotonic s of the last message, while stalled
        self.step_started: float | None = None  # time.time() of the running step
        self.restarting = False
        self.num_restarts = 0
        self.proc: EngineHandle | None = None
        self._ready_waiter: asyncio.Future | None = None

    @property
    def health_problem(self) -> str | None:
        """Why the engine cannot take new requests now (dead, restarting,
        stalled), or ``None`` when it can."""
        if self.dead_reason is not None:
            suffix = " (restarting the engine)" if self.restarting else ""
            return self.dead_reason + suffix
        if self.stalled_since is not None:
            silent = time.monotonic() - self.stalled_since
            return f"engine stalled: no heartbeat for {silent:.1f} s"
        return None

    async def start(self) -> dict:
        """Start the engine process and wait until it is ready.

        Returns:
            The engine's ``info`` map.
        Raises:
            EngineStartupError: the process exited, reported a startup error
                (message included) or was not ready within ``startup_timeout``
                seconds; the process is killed and reaped.
        """
        self.proc = self._spawn()
        handshake = asyncio.create_task(self._handshake())
        deadline = time.monotonic() + self.startup_timeout
        try:
            while not handshake.done():
                await asyncio.wait({handshake}, timeout=WATCHDOG_PERIOD_S)
                if handshake.done():
                    break
                if self.proc.poll() is not None:
                    # Give a StartupError already on the wire a moment to arrive.
                    await asyncio.wait({handshake}, timeout=1.0)
                    if not handshake.done():
                        raise EngineStartupError(
                            f"{self.proc.exit_message()} before it was ready "
                            "(see its log above)"
                        )
                elif time.monotonic() > deadline:
                    raise EngineStartupError(
                        f"engine was not ready within {self.startup_timeout:.0f} s"
                    )
            self.info = handshake.result()
        except BaseException:
            handshake.cancel()
            await self.stop(kill=True)
            raise
        return self.info

    async def _handshake(self) -> dict:
        await self.link.send_now(Config(config=self.config.to_dict(), token=self.token))
        while True:
            msg = await self.link.receive()
            if not isinstance(msg, (Ready, StartupError)):
                continue
            if msg.token != self.token:
                logger.error("dropping a %s message without the handshake token",
                             type(msg).__name__)  # fmt: skip
                continue
            if isinstance(msg, Ready):
                return dict(msg.info)
            raise EngineStartupError(f"engine failed to start: {msg.error}")

    def _spawn(self) -> EngineHandle:
        """Start an engine connecting to the link's two sockets."""
        return self.launcher.launch(
            self.index, self.link.input_address, self.link.output_address, self.token,
            self.engine_cls, self.heartbeat_interval, self.log_level, self.env,
            keys=self.link.engine_keys,
        )  # fmt: skip

    async def stop(self, kill: bool) -> None:
        """Wait up to 5 s for the process to exit (kill it at once with
        ``kill``, or after those 5 s) and reap it."""
        if self.proc is None:
            return
        if kill:
            self.proc.kill()
        deadline = time.monotonic() + 5.0
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            deadline = time.monotonic() + 10.0  # a Ray node may be gone unreachable
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

    def mark_dead(self, reason: str) -> None:
        """Declare the engine dead (once) and tell ``on_dead``."""
        if self.dead_reason is not None:
            return
        logger.error("engine %d is dead: %s", self.index, reason)
        self.dead_reason = reason
        self.stalled_since = None
        self.on_dead(reason)

    async def watch(self) -> None:
        """The watchdog loop (runs until cancelled, or until a dead engine
        is not to be restarted)."""
        backoff = 1.0
        while True:
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            if self.dead_reason is None:
                self._check()
            elif not self.restart_engine:
                return
            elif await self._restart():
                backoff = 1.0
            else:
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)

    def _check(self) -> None:
        """One look at the process: exited, stalled, recovered, or a step too long."""
        if self.proc.poll() is not None:
            self.mark_dead(self.proc.exit_message())
            return
        silent = time.monotonic() - self.link.last_seen
        if silent > self.stall_timeout:
            if self.stalled_since is None:
                self.stalled_since = self.link.last_seen
                logger.warning("engine stalled: no heartbeat for %.1f s", silent)
            if self.step_timeout is not None and silent > self.step_timeout:
                self.mark_dead(f"engine stalled: no heartbeat for {silent:.1f} s "
                               "(--engine-step-timeout)")  # fmt: skip
                self.proc.kill()
            return
        if self.stalled_since is not None:
            logger.warning("engine recovered after %.1f s without a heartbeat",
                           self.link.last_seen - self.stalled_since)  # fmt: skip
            self.stalled_since = None
        started = self.step_started
        if self.step_timeout is not None and started is not None \
                and time.time() - started > self.step_timeout:  # fmt: skip
            self.mark_dead(f"engine stalled: one step has run for over {self.step_timeout:.1f} s "
                           "(--engine-step-timeout)")  # fmt: skip
            self.step_started = None
            self.proc.kill()

    async def _restart(self) -> bool:
        """Replace a dead engine process with a new one.

        Returns:
            True when the new engine is ready.
        """
        self.restarting = True
        logger.warning("restarting engine %d after: %s", self.index, self.dead_reason)
        try:
            self.proc.kill()
            while self.proc.poll() is None:
                await asyncio.sleep(WATCHDOG_PERIOD_S)
            self.link.clear_outbox()  # meant for the dead engine
            self.proc = self._spawn()
            self._ready_waiter = asyncio.get_running_loop().create_future()
            config = Config(config=self.config.to_dict(), token=self.token)
            self.link.send(config)
            deadline = time.monotonic() + self.startup_timeout
            resend = time.monotonic() + CONFIG_RESEND_S
            while not self._ready_waiter.done():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise EngineStartupError("the new engine process did not become ready")
                await asyncio.wait({self._ready_waiter}, timeout=WATCHDOG_PERIOD_S)
                if time.monotonic() > resend and not self._ready_waiter.done():
                    # Over tcp the dead engine's connection may not be closed yet when
                    # its death is known, and the PUSH socket may hand it the Config:
                    # send it again until the new engine answers (it takes the first).
                    self.link.send(config)
                    resend = time.monotonic() + CONFIG_RESEND_S
            self.info = self._ready_waiter.result()
        except EngineStartupError as e:
            logger.error("engine restart failed: %s", e)
            self.proc.kill()
            return False
        finally:
            self._ready_waiter = None
            self.restarting = False
        self.link.last_seen = time.monotonic()
        self.num_restarts += 1
        self.dead_reason = None
        self.step_started = None
        logger.warning("engine %d restarted (pid %s)", self.index, self.proc.pid)
        return True

    def on_handshake(self, msg: Ready | StartupError) -> None:
        """A ``Ready`` or ``StartupError`` after the start: a restarted engine's."""
        waiter = self._ready_waiter
        if waiter is None or waiter.done() or msg.token != self.token:
            logger.error("dropping an unexpected %s message", type(msg).__name__)
            return
        if isinstance(msg, Ready):
            waiter.set_result(dict(msg.info))
        else:
            waiter.set_exception(EngineStartupError(f"engine failed to start: {msg.error}"))

