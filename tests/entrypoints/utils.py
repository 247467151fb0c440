"""Helpers to run `paternoster serve` in a subprocess for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_ENGINE = "tests.entrypoints.fake_engine:FakeEngineCore"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment in which `python -m paternoster...` and the tests package import."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT / "python"), str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    return env


@dataclass
class Server:
    """A running server: its base URL (``http://127.0.0.1:PORT``) and process."""

    url: str
    proc: subprocess.Popen

    def get(self, path: str, **kw) -> httpx.Response:
        """GET ``path`` (5 s timeout)."""
        return httpx.get(self.url + path, timeout=5, **kw)

    def engine_pid(self) -> int:
        """Pid of the engine process (from /stats)."""
        return self.get("/stats").json()["engine_pid"]

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "condition") -> dict:
        """Poll /stats until ``predicate(stats)`` holds; return those stats."""
        deadline = time.monotonic() + timeout
        stats = {}
        while time.monotonic() < deadline:
            stats = self.get("/stats").json()
            if predicate(stats):
                return stats
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last /stats: {stats}")


@contextlib.contextmanager
def start_server(*args: str, timeout: float = 180.0,
                 new_session: bool = False) -> Iterator[Server]:
    """Start `python -m paternoster.entrypoints.cli serve *args` on a free port,
    wait until /health answers 200, and stop it afterwards. ``new_session``:
    in its own session and process group (as a shell starts a foreground job),
    so a test can signal the whole group like Ctrl-C in a terminal does."""
    port = free_port()
    cmd = [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", *args]
    cmd += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO_ROOT, start_new_session=new_session)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy within {timeout} s")
            time.sleep(0.2)
        yield Server(url, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
