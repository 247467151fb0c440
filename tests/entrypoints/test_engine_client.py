"""EngineClient against a fake engine process: streaming, aborts, startup
failures, and engine death or stall ending every request promptly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import aclosing

import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.messages import EngineCoreRequest
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import EngineDeadError, EngineStartupError, RequestRejectedError
from paternoster.sampling_params import SamplingParams
from tests.entrypoints.utils import FAKE_ENGINE, REPO_ROOT, child_env


def run(coro, timeout: float = 60.0):
    """Run a test coroutine with a hard time bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def fake_dir(tmp_path, monkeypatch):
    """A model dir for the fake engine; write options with ``fake_dir.opts(**kw)``."""
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))

    class D:
        path = str(tmp_path)

        @staticmethod
        def opts(**kw):
            (tmp_path / "fake_engine.json").write_text(json.dumps(kw))

    return D


def _client(path: str, **kw) -> EngineClient:
    kw.setdefault("startup_timeout", 30)
    return EngineClient(EngineConfig(ModelConfig(path)), engine_cls=FAKE_ENGINE, **kw)


def _req(rid: str, max_tokens: int = 4, prompt=(1, 2, 3)) -> EngineCoreRequest:
    return EngineCoreRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens))


async def _collect(client: EngineClient, req: EngineCoreRequest) -> list:
    return [o async for o in client.generate(req)]


async def _wait_stats(client: EngineClient, pred, timeout=5.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.stats and pred(client.stats):
            return client.stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"stats never satisfied the condition: {client.stats}")


def test_generate_streams_until_finished_and_shutdown_is_clean(fake_dir):
    async def main():
        client = _client(fake_dir.path)
        info = await client.start()
        assert info["max_model_len"] == 256
        try:
            results = await asyncio.gather(*[_collect(client, _req(f"r{i}")) for i in range(8)])
            for outs in results:
                assert [o.new_token_ids[0] for o in outs] == [1000, 1001, 1002, 1003]
                assert [o.finish_reason for o in outs] == [None, None, None, "length"]
            stats = await _wait_stats(client, lambda s: s["num_running"] == 0)
            assert stats["num_free_blocks"] == stats["num_kv_blocks"]
        finally:
            tmpdir = client.link._tmpdir
            await client.shutdown()
        assert client.supervisor.proc.returncode == 0
        assert not os.path.exists(tmpdir)

    run(main())


def test_rejected_request_raises_with_the_engines_message(fake_dir):
    async def main():
        client = _client(fake_dir.path)
        await client.start()
        try:
            with pytest.raises(RequestRejectedError, match=r"prompt \(3\) \+ max_tokens \(999\)"):
                await _collect(client, _req("big", max_tokens=999))
            assert len(await _collect(client, _req("ok"))) == 4  # engine still fine
        finally:
            await client.shutdown()

    run(main())


def test_closing_the_stream_early_aborts_the_engine_request(fake_dir):
    fake_dir.opts(step_delay=0.02)

    async def main():
        client = _client(fake_dir.path)
        await client.start()
        try:
            async with aclosing(client.generate(_req("long", max_tokens=200))) as gen:
                async for _ in gen:
                    break
            await _wait_stats(client, lambda s: s["num_running"] == 0)
            assert client.num_in_flight == 0
        finally:
            await client.shutdown()

    run(main())


def test_startup_error_message_reaches_the_caller(fake_dir):
    fake_dir.opts(fail_init="no such model: /nowhere")

    async def main():
        client = _client(fake_dir.path)
        t = time.monotonic()
        with pytest.raises(EngineStartupError, match="no such model: /nowhere"):
            await client.start()
        assert time.monotonic() - t < 20
        assert client.supervisor.proc.poll() is not None

    run(main())


def test_unimportable_engine_fails_startup(fake_dir):
    async def main():
        client = EngineClient(
            EngineConfig(ModelConfig(fake_dir.path)), engine_cls="no_such_module:X",
            startup_timeout=30,
        )  # fmt: skip
        with pytest.raises(EngineStartupError, match="no_such_module"):
            await client.start()

    run(main())


def test_killed_engine_fails_in_flight_requests_fast(fake_dir):
    fake_dir.opts(step_delay=0.05)

    async def main():
        client = _client(fake_dir.path)
        await client.start()
        try:
            task = asyncio.create_task(_collect(client, _req("victim", max_tokens=200)))
            await _wait_stats(client, lambda s: s["num_running"] == 1)
            os.kill(client.pid, signal.SIGKILL)
            t = time.monotonic()
            with pytest.raises(EngineDeadError, match="exited with code"):
                await asyncio.wait_for(task, 5)
            assert time.monotonic() - t < 2.0
            assert not client.is_alive
            with pytest.raises(EngineDeadError):
                await _collect(client, _req("after"))
        finally:
            await client.shutdown()

    run(main())


def test_stalled_engine_is_declared_dead(fake_dir):
    fake_dir.opts(hang_at_step=3)

    async def main():
        client = _client(
            fake_dir.path, stall_timeout=1.0, step_timeout=1.0, heartbeat_interval=0.2
        )
        await client.start()
        try:
            t = time.monotonic()
            with pytest.raises(EngineDeadError, match="one step has run"):
                await asyncio.wait_for(_collect(client, _req("stuck", max_tokens=50)), 10)
            assert time.monotonic() - t < 3.0
            await asyncio.sleep(0.5)
            assert client.supervisor.proc.poll() is not None  # the stuck process was killed
        finally:
            await client.shutdown()

    run(main())


def test_a_step_longer_than_the_stall_timeout_is_not_a_death(fake_dir):
    """The engine beats from its own thread: a 2.5 s step (a long prefill) under a
    1 s stall timeout finishes, and the engine stays alive."""
    fake_dir.opts(step_delay=2.5)

    async def main():
        client = _client(fake_dir.path, stall_timeout=1.0, heartbeat_interval=0.2)
        await client.start()
        try:
            outs = await asyncio.wait_for(_collect(client, _req("slow", max_tokens=2)), 20)
            assert outs[-1].finish_reason == "length"
            assert client.dead_reason is None
            assert client.supervisor.proc.poll() is None
        finally:
            await client.shutdown()

    run(main())


def test_step_exception_is_reported_as_engine_death(fake_dir):
    fake_dir.opts(crash_at_step=2)

    async def main():
        client = _client(fake_dir.path)
        await client.start()
        try:
            with pytest.raises(EngineDeadError, match="fake crash"):
                await asyncio.wait_for(_collect(client, _req("x", max_tokens=10)), 10)
        finally:
            await client.shutdown()

    run(main())


def test_engine_exits_when_the_frontend_dies(fake_dir):
    script = f"""
import asyncio, os, signal, sys
from paternoster.config import EngineConfig, ModelConfig
from paternoster.frontend.engine_client import EngineClient

async def main():
    client = EngineClient(EngineConfig(ModelConfig({fake_dir.path!r})), engine_cls={FAKE_ENGINE!r})
    await client.start()
    print(client.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=60
    )
    engine_pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _pid_alive(engine_pid):
        time.sleep(0.05)
    assert not _pid_alive(engine_pid)


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
