"""Where an engine runs: a local process, or a Ray actor on another node.

The supervisor starts engines through an :class:`EngineLauncher` and watches
each through the :class:`EngineHandle` it returns. Both kinds run the same
engine main loop (:func:`paternoster.engine.process.run_engine`) and speak the
same messages over the same link; only the transport differs:

- :class:`LocalLauncher` (``--distributed-executor-backend mp``, the default):
  ``python -m paternoster.engine.process`` as a child process, linked over
  ``ipc://`` sockets in a private temp dir.
- :class:`~paternoster.frontend.ray_executor.RayLauncher` (``ray``): a Ray
  actor placed in a placement-group bundle, linked over ``tcp://`` to the
  frontend's node IP, with ZeroMQ CURVE (:mod:`paternoster.engine.curve`).

A launcher hands the engine its secrets, the handshake token and, for a tcp
link, its CURVE keys, on the channel that starts it, never on a command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from paternoster.engine.curve import CURVE_KEYS_ENV, EngineKeys
from paternoster.engine.process import TOKEN_ENV


class EngineHandle(Protocol):
    """One started engine, as the supervisor watches it."""

    @property
    def pid(self) -> int | None:
        """The engine's process id (on its own node), when known."""

    def poll(self) -> int | None:
        """The exit code once the engine is gone, ``None`` while it runs
        (never blocks)."""

    def kill(self) -> None:
        """Kill the engine now (no-op when it is gone)."""

    def exit_message(self) -> str:
        """Why the engine is gone, in words (after :meth:`poll` returned a code)."""

    def location(self) -> dict:
        """Where it runs, for ``/stats`` (empty for a local process)."""


class EngineLauncher(Protocol):
    """Starts engines that connect to a bound link."""

    #: The host the frontend binds its link on: ``None`` for ``ipc://``
    #: sockets, an IP address for ``tcp://``.
    bind_host: str | None

    def launch(self, index: int, input_address: str, output_address: str, token: str,
               engine_cls: str, heartbeat_interval: float, log_level: str,
               env: dict[str, str], keys: EngineKeys | None = None) -> EngineHandle:  # fmt: skip
        """Start engine ``index`` connecting to the two link addresses.

        Args:
            index: the engine's data-parallel index.
            input_address: where the engine PULLs its inputs.
            output_address: where the engine PUSHes its outputs.
            token: the handshake token (never on a command line).
            engine_cls: ``"module:Class"`` the engine builds.
            heartbeat_interval: seconds between heartbeats.
            log_level: the engine's log level.
            env: environment variables for the engine only.
            keys: the engine's CURVE keys for a tcp link (never on a
                command line); ``None`` for ``ipc://``.
        """


class LocalProcess:
    """An engine child process (a :class:`subprocess.Popen`)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """The child's exit code once reaped, else ``None``."""
        return self.proc.returncode

    def poll(self) -> int | None:
        """The child's exit code, or ``None`` while it runs."""
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the child (no-op once it exited)."""
        if self.proc.poll() is None:
            self.proc.kill()

    def exit_message(self) -> str:
        """``engine process exited with code N``."""
        return f"engine process exited with code {self.proc.returncode}"

    def location(self) -> dict:
        """Nothing to add: a local process is on this machine."""
        return {}


class LocalLauncher:
    """Starts each engine as ``python -m paternoster.engine.process``, a child
    of this process that exits when its parent dies."""

    bind_host: str | None = None

    def launch(self, index: int, input_address: str, output_address: str, token: str,
               engine_cls: str, heartbeat_interval: float, log_level: str,
               env: dict[str, str], keys: EngineKeys | None = None) -> LocalProcess:  # fmt: skip
        """Spawn the child (see :meth:`EngineLauncher.launch`); the token goes in
        ``PATERNOSTER_ENGINE_TOKEN``, CURVE keys (a tcp link) in
        ``PATERNOSTER_ENGINE_CURVE_KEYS``."""
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "paternoster.engine.process",
                "--input", input_address, "--output", output_address,
                "--parent-pid", str(os.getpid()),
                "--engine-cls", engine_cls,
                "--heartbeat-interval", str(heartbeat_interval),
                "--log-level", log_level,
            ],
            env=child_env(token, env, keys),
        )  # fmt: skip
        return LocalProcess(proc)


def child_env(token: str, extra: dict[str, str] | None = None,
              keys: EngineKeys | None = None) -> dict[str, str]:  # fmt: skip
    """Our environment plus ``extra``, with this package importable in the
    child, the handshake ``token`` in ``PATERNOSTER_ENGINE_TOKEN`` and the
    CURVE ``keys``, if any, in ``PATERNOSTER_ENGINE_CURVE_KEYS``."""
    env = {**os.environ, **(extra or {})}
    env[TOKEN_ENV] = token
    env.pop(CURVE_KEYS_ENV, None)  # never a key inherited from our own environment
    if keys is not None:
        env[CURVE_KEYS_ENV] = keys.to_env()
    root = str(Path(__file__).resolve().parents[2])  # the dir holding paternoster/
    parts = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
