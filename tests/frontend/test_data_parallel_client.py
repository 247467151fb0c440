"""DataParallelClient over two fake engine processes: routing, aborts to the
right engine, one waiting queue for the server, startup errors that name the
engine."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.messages import EngineCoreRequest
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.errors import EngineOverloadedError, EngineStartupError
from paternoster.sampling_params import SamplingParams
from tests.entrypoints.utils import FAKE_ENGINE, REPO_ROOT


def run(coro, timeout: float = 60.0):
    """Run a test coroutine with a hard time bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def fake_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    (tmp_path / "fake_engine.json").write_text(json.dumps({"step_delay": 0.01}))
    return tmp_path


def _dp(path, **kw) -> DataParallelClient:
    return DataParallelClient.create(EngineConfig(ModelConfig(str(path))), 2,
                                     engine_cls=FAKE_ENGINE, startup_timeout=30, **kw)  # fmt: skip


def _req(rid: str, prompt, max_tokens: int = 4) -> EngineCoreRequest:
    return EngineCoreRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens))


def test_requests_spread_and_shared_prefixes_stay_together(fake_dir):
    async def main():
        dp = _dp(fake_dir)
        await dp.start()
        try:
            long = list(range(1, 65))  # four full blocks of 16
            outs = await asyncio.gather(*(
                _collect(dp, _req(f"p{i}", long + [100 + i])) for i in range(4)))
            assert all(o[-1].finished for o in outs)
            spread = await asyncio.gather(*(
                _collect(dp, _req(f"s{i}", [200 + i, 1], 30)) for i in range(2)))
            assert all(len(o) == 30 for o in spread)
            return dp.router.num_affinity_routed, [c.num_in_flight for c in dp.engines]
        finally:
            await dp.shutdown()

    affinity, in_flight = run(main())
    assert affinity == 3 and in_flight == [0, 0]


async def _collect(dp, req):
    async with aclosing(dp.generate(req)) as it:
        return [o async for o in it]


def test_abort_goes_to_the_engine_running_the_request(fake_dir):
    async def main():
        dp = _dp(fake_dir)
        await dp.start()
        try:
            gens = [dp.generate(_req(f"r{i}", [300 + i], 200)) for i in range(2)]
            firsts = [await g.__anext__() for g in gens]
            owners = [dp.engine_of(f"r{i}") for i in range(2)]
            dp.abort(["r1"])
            last = None
            async for out in gens[1]:
                last = out
            assert last.finish_reason == "abort"
            assert dp.engines[owners[0]].num_in_flight == 1  # r0 still runs
            await gens[0].aclose()
            return firsts, sorted(owners)
        finally:
            await dp.shutdown()

    firsts, owners = run(main())
    assert owners == [0, 1] and all(not f.finished for f in firsts)


def test_waiting_limit_holds_for_the_server_as_a_whole(fake_dir):
    async def main():
        dp = _dp(fake_dir, max_waiting_requests=2)
        await dp.start()
        try:
            held = dp.check_capacity(2, 4)
            with pytest.raises(EngineOverloadedError):
                dp.check_capacity(1, 2)
            held.release()
            dp.check_capacity(1, 2).release()
        finally:
            await dp.shutdown()

    run(main())


def test_a_failed_engine_start_names_the_engine_and_stops_the_others(fake_dir):
    (fake_dir / "fake_engine.json").write_text(json.dumps({"fail_init": "no weights"}))

    async def main():
        dp = _dp(fake_dir)
        with pytest.raises(EngineStartupError, match=r"engine 0: .*no weights"):
            await dp.start()
        return [c.supervisor.proc.poll() is not None for c in dp.engines]

    assert run(main()) == [True, True]


def test_mismatched_clients_are_refused(fake_dir):
    from paternoster.frontend.engine_client import EngineClient
    from paternoster.frontend.router import Router

    config = EngineConfig(ModelConfig(str(fake_dir)))
    with pytest.raises(ValueError, match="share one Admission"):
        DataParallelClient([EngineClient(config), EngineClient(config)])
    with pytest.raises(ValueError, match="at least one"):
        DataParallelClient([])
    with pytest.raises(ValueError, match="router is for 3 engines"):
        DataParallelClient([EngineClient(config)], Router(3))


def test_unknown_backend_and_a_ray_address_without_ray_are_refused(tmp_path):
    config = EngineConfig(ModelConfig(str(tmp_path)))
    with pytest.raises(ValueError, match="distributed_executor_backend must be 'mp' or 'ray'"):
        DataParallelClient.create(config, 2, distributed_executor_backend="mpi")
    with pytest.raises(ValueError, match="--ray-address needs --distributed-executor-backend ray"):
        DataParallelClient.create(config, 2, ray_address="127.0.0.1:6379")


def test_ray_backend_without_a_cluster_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = EngineConfig(ModelConfig(str(tmp_path)))
    with pytest.raises(ValueError, match="no Ray cluster at '127.0.0.1:9'.*ray start --head"):
        DataParallelClient.create(config, 2, distributed_executor_backend="ray",
                                  ray_address="127.0.0.1:9")  # fmt: skip
