"""Engine counters in /stats (and the /metrics gauges) are current to the engine's
latest step: every ``outputs`` message carries a stats snapshot taken after the
step, so they do not lag by a heartbeat; a heartbeat or an ``outputs`` message
that arrives late (two sockets, no order between them) never replaces a newer
snapshot."""

from __future__ import annotations

import asyncio
import shutil
import time
from contextlib import aclosing

import httpx

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.messages import EngineCoreRequest, Heartbeat, Outputs
from paternoster.frontend.engine_client import EngineClient
from paternoster.sampling_params import SamplingParams
from tests.hardening.conftest import QUEUEING_ENGINE, fake_server

HEARTBEAT_S = 60.0  # so long that no heartbeat arrives during the test


def test_stats_after_each_response_count_every_step(fake_model_dir):
    # One token per step, one request at a time: the fake engine's step count
    # after each response is the sum of max_tokens so far, exactly.
    with fake_server(fake_model_dir, {"step_delay": 0.01}) as srv:
        srv.wait_for(lambda s: "num_steps" in s["engine"], what="first stats")
        steps = srv.get("/stats").json()["engine"]["num_steps"]
        for max_tokens, stream in ((3, False), (7, True), (1, False), (12, True)):
            body = {"prompt": "Hi", "max_tokens": max_tokens, "ignore_eos": True,
                    "stream": stream}  # fmt: skip
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            steps += max_tokens
            engine = srv.get("/stats").json()["engine"]  # read once: no polling
            assert engine["num_steps"] == steps, (engine, steps)
            assert engine["num_running"] == 0 and engine["kv_cache_usage"] == 0, engine


def test_outputs_messages_refresh_stats_without_heartbeats(fake_model_dir, tmp_path):
    model = shutil.copytree(fake_model_dir, tmp_path / "model")
    (model / "fake_engine.json").write_text('{"step_delay": 0.02}')

    async def main() -> None:
        client = EngineClient(
            EngineConfig(ModelConfig(str(model))), engine_cls=QUEUEING_ENGINE,
            heartbeat_interval=HEARTBEAT_S, stall_timeout=10 * HEARTBEAT_S, startup_timeout=30,
        )  # fmt: skip
        await client.start()
        try:
            params = SamplingParams(max_tokens=5, ignore_eos=True)
            k = 0
            async for out in client.generate(EngineCoreRequest("a", [1, 2, 3], params)):
                k += 1
                assert client.stats["num_steps"] >= k  # from this output's message (or later)
                if not out.finished:
                    assert client.stats["num_running"] == 1
            assert client.stats["num_steps"] == 5 and client.stats["num_running"] == 0
            # An abort's output message refreshes them too, long before a heartbeat.
            long = EngineCoreRequest("b", [1, 2, 3], SamplingParams(max_tokens=200))
            async with aclosing(client.generate(long)) as gen:
                async for _ in gen:
                    break
            t0 = time.monotonic()
            while client.stats["num_running"] != 0:
                assert time.monotonic() - t0 < 5, client.stats
                await asyncio.sleep(0.01)
            assert client.stats["kv_cache_usage"] == 0
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_older_snapshot_never_replaces_a_newer_one():
    client = EngineClient(None)
    client._on_outputs(Outputs(outputs=[], stats={"num_running": 3}, stats_time=10.0))
    client._on_heartbeat(Heartbeat(stats={"num_running": 5}, stats_time=9.5))
    assert client.stats == {"num_running": 3}
    client._on_heartbeat(Heartbeat(stats={"num_running": 0}, stats_time=10.0))
    assert client.stats == {"num_running": 0}  # the same snapshot again is fine
    client._on_heartbeat(Heartbeat(stats={"num_running": 2}, stats_time=11))
    assert client.stats == {"num_running": 2}
