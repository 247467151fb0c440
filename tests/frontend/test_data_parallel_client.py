"""DataParallelClient over two fake engine processes: routing, aborts to the
right engine, one waiting queue for the server, startup errors that name the
engine, and an engine death: a request that had no output yet moves to a
live engine (once), one that had output fails."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from contextlib import aclosing

import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.messages import EngineCoreRequest
from paternoster.frontend.data_parallel import DataParallelClient
from paternoster.frontend.errors import (
    EngineDeadError,
    EngineOverloadedError,
    EngineStartupError,
)
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


def _dp(path, n: int = 2, **kw) -> DataParallelClient:
    return DataParallelClient.create(EngineConfig(ModelConfig(str(path))), n,
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


# ------------------------------------------------------------- engine death
# The fake engines echo the prompt, so a request's tokens tell where they came
# from. Round-robin routing sends the first request to engine 0. An engine
# stopped with SIGSTOP takes a request and never answers (it counts as live
# for --engine-stall-timeout, 10 s): killing it then is an engine that died
# before the request's first output.


@pytest.fixture
def echo_dir(fake_dir):
    (fake_dir / "fake_engine.json").write_text(json.dumps({"step_delay": 0.01,
                                                           "echo_prompt": True}))  # fmt: skip
    return fake_dir


def _signal(dp, engine: int, sig: int) -> None:
    os.kill(dp.engines[engine].pid, sig)


async def _until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _tokens(outputs) -> tuple[list[int], str | None]:
    """All the tokens of a stream and its finish reason."""
    tokens, reason = [], None
    async with aclosing(outputs) as it:
        async for out in it:
            tokens += out.new_token_ids
            reason = out.finish_reason
    return tokens, reason


async def _stranded(dp, request, reservation=None) -> asyncio.Task:
    """``request`` sent to engine 0, stopped first: it can have no output."""
    _signal(dp, 0, signal.SIGSTOP)
    task = asyncio.create_task(_tokens(dp.generate(request, reservation)))
    await _until(lambda: dp.engine_of(request.request_id) is not None, "the request to be routed")
    assert dp.engine_of(request.request_id) == 0
    return task


@pytest.mark.parametrize("restart_engine", [False, True])
def test_a_request_whose_engine_dies_before_output_finishes_on_a_live_one(echo_dir,
                                                                          restart_engine):
    async def main():
        dp = _dp(echo_dir, routing="round_robin", max_waiting_requests=8,
                 restart_engine=restart_engine)  # fmt: skip
        await dp.start()
        try:
            reservation = dp.check_capacity(2, 6)  # as for n=2: one share is this request's
            task = await _stranded(dp, _req("r", [500, 501, 502], 5), reservation)
            assert (dp.num_waiting, dp.num_reserved) == (1, 1)
            _signal(dp, 0, signal.SIGKILL)
            got = await task
            restarted = dp.engines[0].num_restarts  # 0: the re-route did not wait for it
            # The same request, asked of the surviving engine afresh.
            again = await _tokens(dp.generate(_req("again", [500, 501, 502], 5)))
            counts = (dp.num_rerouted, dp.num_waiting, dp.num_reserved, dp.num_in_flight,
                      restarted)  # fmt: skip
            reservation.release()
            if restart_engine:  # it did not wait for the restart, which still comes
                await _until(lambda: dp.engines[0].is_alive, "engine 0 restarted")
            return got, again, counts
        finally:
            await dp.shutdown()

    got, again, counts = run(main())
    assert got == again == ([500, 501, 502, 500, 501], "length")
    # Re-routed once; waiting counted once and done; the other choice's share
    # of the reservation is still reserved (not taken by the second send).
    assert counts == (1, 0, 1, 0, 0)


def test_a_request_routed_to_an_engine_just_dead_finishes_on_a_live_one(echo_dir):
    async def main():
        dp = _dp(echo_dir, routing="round_robin")
        await dp.start()
        try:
            _signal(dp, 0, signal.SIGKILL)
            time.sleep(0.2)  # the process is gone, but the watchdog has not run since
            task = asyncio.create_task(_tokens(dp.generate(_req("r", [7, 8], 4))))
            await asyncio.sleep(0)  # the request is routed (first) before the watchdog looks
            routed_to = dp.engine_of("r")
            got = await task
            return routed_to, got, dp.num_rerouted, dp.engines[0].dead_reason
        finally:
            await dp.shutdown()

    routed_to, got, rerouted, dead_reason = run(main())
    assert routed_to == 0 and dead_reason is not None
    assert got == ([7, 8, 7, 8], "length") and rerouted == 1


def test_an_abort_after_the_reroute_reaches_the_new_engine(echo_dir):
    async def main():
        dp = _dp(echo_dir, routing="round_robin")
        await dp.start()
        try:
            _signal(dp, 0, signal.SIGSTOP)
            outputs = dp.generate(_req("r", [9], 200))
            first = asyncio.create_task(anext(outputs))
            await _until(lambda: dp.engine_of("r") == 0, "the request on engine 0")
            _signal(dp, 0, signal.SIGKILL)
            head = await first
            owner = dp.engine_of("r")
            dp.abort(["r"])
            tokens, reason = await _tokens(outputs)
            return head.new_token_ids, owner, reason, len(tokens), dp.engines[1].num_in_flight
        finally:
            await dp.shutdown()

    head, owner, reason, num_more, in_flight = run(main())
    assert head == [9] and owner == 1
    assert reason == "abort" and num_more < 199 and in_flight == 0


def test_a_request_that_had_output_fails_when_its_engine_dies(echo_dir):
    async def main():
        dp = _dp(echo_dir, routing="round_robin")
        await dp.start()
        try:
            outputs = dp.generate(_req("r", [5], 200))
            head = await anext(outputs)
            assert dp.engine_of("r") == 0
            _signal(dp, 0, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="engine process exited"):
                await _tokens(outputs)
            survivor = await _tokens(dp.generate(_req("next", [6], 3)))
            return head.new_token_ids, dp.num_rerouted, survivor
        finally:
            await dp.shutdown()

    head, rerouted, survivor = run(main(), timeout=30)
    assert head == [5] and rerouted == 0 and survivor == ([6, 6, 6], "length")


def test_a_request_is_rerouted_at_most_once(echo_dir):
    async def main():
        dp = _dp(echo_dir, 3, routing="round_robin")
        await dp.start()
        try:
            _signal(dp, 1, signal.SIGSTOP)  # the re-route's target, stopped too
            task = await _stranded(dp, _req("r", [5], 4))
            _signal(dp, 0, signal.SIGKILL)
            await _until(lambda: dp.engine_of("r") == 1, "the request re-routed to engine 1")
            _signal(dp, 1, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="engine process exited"):
                await task
            survivor = await _tokens(dp.generate(_req("next", [6], 2)))
            return dp.num_rerouted, survivor
        finally:
            await dp.shutdown()

    rerouted, survivor = run(main(), timeout=30)
    assert rerouted == 1 and survivor == ([6, 6], "length")  # engine 2 lives: not tried


def test_with_no_live_engine_left_the_request_fails_at_once(echo_dir):
    async def main():
        dp = _dp(echo_dir, routing="round_robin")
        await dp.start()
        try:
            _signal(dp, 1, signal.SIGKILL)
            await _until(lambda: dp.engines[1].dead_reason is not None, "engine 1 dead")
            task = await _stranded(dp, _req("r", [5], 4))
            _signal(dp, 0, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="engine process exited"):
                await task
            return dp.num_rerouted, dp.unavailable_reason
        finally:
            await dp.shutdown()

    rerouted, reason = run(main(), timeout=30)
    assert rerouted == 0 and reason.startswith("no engine can serve")


def test_with_one_engine_a_request_whose_engine_dies_fails_as_before(echo_dir):
    async def main():
        dp = _dp(echo_dir, 1)
        await dp.start()
        try:
            task = await _stranded(dp, _req("r", [5], 4))
            _signal(dp, 0, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="engine process exited"):
                await task
            return dp.num_rerouted
        finally:
            await dp.shutdown()

    assert run(main(), timeout=30) == 0
