"""Admission control is atomic: :meth:`EngineClient.check_capacity` reserves
the room of what it admits in the same step, so a burst of requests checked
in one event-loop turn (before any of them is sent to the engine) admits no
more than ``--max-waiting-requests``, and every path on which an admitted
request is never sent gives its room back (docs/errors.md, "Overload").

The server tests run the app in this process over a real engine client (the
queueing fake engine, one request running at a time), so that a gate on the
tokenizer step can release a whole burst into the capacity check in one
event-loop turn.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import shutil
import time
from contextlib import aclosing

import httpx
import pytest

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.messages import EngineCoreRequest
from paternoster.entrypoints.openai.api_server import build_app
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.errors import EngineDeadError, EngineOverloadedError
from paternoster.frontend.generation import Generation
from paternoster.sampling_params import SamplingParams
from tests.hardening.conftest import QUEUEING_ENGINE

CAP = 3
BURST = 12


# --------------------------------------------------------- the engine client


def test_checks_in_one_turn_admit_exactly_the_cap():
    client = EngineClient(None, max_waiting_requests=CAP)
    admitted, refused = [], []
    for _ in range(BURST):  # nothing is sent in between: only reservations count
        try:
            admitted.append(client.check_capacity(1, 5))
        except EngineOverloadedError as e:
            refused.append(e)
    assert len(admitted) == CAP and len(refused) == BURST - CAP
    assert all("--max-waiting-requests 3" in str(e) and e.retry_after == 1 for e in refused)
    assert client.num_reserved == CAP and client.num_reserved_tokens == 5 * CAP
    for r in admitted:
        r.release()
    assert client.num_reserved == 0 and client.num_reserved_tokens == 0


def test_released_reservations_free_their_room():
    client = EngineClient(None, max_waiting_requests=2, max_waiting_tokens=100)
    a = client.check_capacity(1, 40)
    b = client.check_capacity(1, 40)
    with pytest.raises(EngineOverloadedError, match="max-waiting-requests"):
        client.check_capacity(1, 1)
    a.release()
    a.release()  # a second release gives nothing back twice
    assert (client.num_reserved, client.num_reserved_tokens) == (1, 40)
    with pytest.raises(EngineOverloadedError, match="max-waiting-tokens"):
        client.check_capacity(1, 61)
    # An error after the check (a validation step, say) leaves the with block: released.
    with pytest.raises(ValueError, match="after the check"):
        with client.check_capacity(1, 60):
            assert client.num_reserved == 2
            raise ValueError("refused after the check")
    assert (client.num_reserved, client.num_reserved_tokens) == (1, 40)
    b.release()
    # Work bigger than both limits is admitted when nothing waits or is reserved...
    big = client.check_capacity(5, 500)
    with pytest.raises(EngineOverloadedError):  # ...and holds the queue while reserved
        client.check_capacity(1, 1)
    big.release()
    client.check_capacity(2, 100).release()
    assert (client.num_reserved, client.num_reserved_tokens) == (0, 0)


def test_a_reservation_nobody_released_is_given_back_when_collected(caplog):
    client = EngineClient(None, max_waiting_requests=1)
    with caplog.at_level(logging.WARNING, "paternoster.client"):
        client.check_capacity(1, 7)  # dropped at once: a bug on some path
        gc.collect()
    assert client.num_reserved == 0 and client.num_reserved_tokens == 0
    assert "never released" in caplog.text
    client.check_capacity(1, 7).release()  # the cap did not shrink


def _model(fake_model_dir, tmp_path, **opts):
    model = shutil.copytree(fake_model_dir, tmp_path / "model")
    (model / "fake_engine.json").write_text(json.dumps(opts))
    return str(model)


def _client(model: str, **kw) -> EngineClient:
    return EngineClient(EngineConfig(ModelConfig(model)), engine_cls=QUEUEING_ENGINE,
                        startup_timeout=30, **kw)  # fmt: skip


def _req(rid: str, prompt: list[int], max_tokens: int = 4) -> EngineCoreRequest:
    return EngineCoreRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


async def _until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_sent_requests_turn_their_share_into_waiting_and_errors_release_the_rest(
    fake_model_dir, tokenizer, tmp_path
):
    model = _model(fake_model_dir, tmp_path, step_delay=0.02, max_running=1)

    async def main() -> None:
        client = _client(model, max_waiting_requests=2)
        await client.start()
        try:
            runner = client.generate(_req("runner", [1], max_tokens=200))
            await runner.__anext__()  # it runs; every request behind it waits
            r = client.check_capacity(2, 5)
            first = client.generate(_req("a", [1, 2, 3]), r)
            step = asyncio.ensure_future(first.__anext__())
            await asyncio.sleep(0)  # sent: one request's share is now waiting
            assert (client.num_waiting, client.num_waiting_tokens) == (1, 3)
            assert (client.num_reserved, client.num_reserved_tokens) == (1, 2)
            with pytest.raises(EngineOverloadedError):
                client.check_capacity(1, 1)
            # Refused before it is sent (a duplicate id): its share stays reserved...
            with pytest.raises(ValueError, match="already in flight"):
                await client.generate(_req("a", [4, 5]), r).__anext__()
            assert client.num_reserved == 1
            r.release()  # ...until the caller gives it back
            assert (client.num_reserved, client.num_reserved_tokens) == (0, 0)
            client.check_capacity(1, 1).release()
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)
            await first.aclose()  # aborted: no longer waiting either
            assert client.num_waiting == 0

            # A generation cancelled before its requests were sent frees their room.
            params = SamplingParams(n=2, max_tokens=4, ignore_eos=True)
            gen = Generation(client, tokenizer, "g", [[7, 8]], params,
                             reservation=client.check_capacity(2, 4))  # fmt: skip
            consumer = asyncio.ensure_future(_drain(gen))
            await asyncio.sleep(0)
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            assert client.num_reserved == 0
            await _until(lambda: client.num_waiting == 0, "aborted choices to stop waiting")

            # One that fails before sending (the server stops accepting) does too.
            gen = Generation(client, tokenizer, "h", [[7, 8]], params,
                             reservation=client.check_capacity(2, 4))  # fmt: skip
            client.stop_accepting("test: shutting down")
            with pytest.raises(EngineDeadError, match="shutting down"):
                await _drain(gen)
            assert (client.num_reserved, client.num_waiting) == (0, 0)
            await runner.aclose()
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_started_generation_that_is_never_streamed_is_aborted_by_release(
    fake_model_dir, tokenizer, tmp_path
):
    """A stream waits for its first output before its status goes out; if the
    response is then never sent, releasing the generation aborts the request
    (it does not run to its 200 tokens). A started one that is streamed yields
    its first delta once, then the rest."""
    model = _model(fake_model_dir, tmp_path, step_delay=0.02, max_running=1)

    async def main() -> None:
        client = _client(model, max_waiting_requests=4)
        await client.start()
        try:
            params = SamplingParams(max_tokens=200, ignore_eos=True)
            gen = Generation(client, tokenizer, "s", [[7, 8]], params,
                             reservation=client.check_capacity(1, 2))  # fmt: skip
            await gen.start()
            assert client.num_in_flight == 1 and len(gen.states[0].token_ids) >= 1
            gen.release()
            await _until(lambda: client.num_in_flight == 0, "the started request to abort")
            assert len(gen.states[0].token_ids) < 200 and client.num_reserved == 0

            params = SamplingParams(max_tokens=5, ignore_eos=True)
            gen = Generation(client, tokenizer, "t", [[7, 8]], params)
            await gen.start()
            async with aclosing(gen.deltas()) as deltas:
                streamed = [t async for d in deltas for t in d.token_ids]
            assert streamed == gen.states[0].token_ids and len(streamed) == 5
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


async def _drain(gen: Generation) -> None:
    async with aclosing(gen.deltas()) as deltas:
        async for _ in deltas:
            pass


# ------------------------------------------------------------------- HTTP


def _gate_tokenizer(serving, expected: int) -> asyncio.Event:
    """Hold every request after tokenization until ``expected`` have come and
    the returned event is set: setting it wakes them all in one loop turn."""
    gate = asyncio.Event()
    tokenize = serving.run_tokenizer
    arrived = 0

    async def gated(fn, *args):
        nonlocal arrived
        out = await tokenize(fn, *args)
        arrived += 1
        if arrived == expected:
            gate.set()
        await gate.wait()
        return out

    serving.run_tokenizer = gated
    return gate


def test_http_burst_in_one_loop_turn_admits_exactly_the_cap(fake_model_dir, tokenizer, tmp_path):
    model = _model(fake_model_dir, tmp_path, step_delay=0.02, max_running=1)

    async def main() -> None:
        client = _client(model, max_waiting_requests=CAP)
        await client.start()
        try:
            app = build_app(client, tokenizer, "fake")
            runner = client.generate(_req("runner", [1], max_tokens=250))
            await runner.__anext__()  # it runs; the burst waits behind it
            gate = _gate_tokenizer(app.state.frontend, BURST)
            peak = {"waiting": 0, "queued": 0}

            async def watch() -> None:
                while True:
                    peak["waiting"] = max(peak["waiting"], client.num_waiting)
                    queued = client.num_waiting + getattr(client, "num_reserved", 0)
                    peak["queued"] = max(peak["queued"], queued)
                    await asyncio.sleep(0)

            watcher = asyncio.ensure_future(watch())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                         timeout=30) as http:  # fmt: skip
                bodies = [{"prompt": [5, 100 + i], "max_tokens": 2, "ignore_eos": True}
                          for i in range(BURST)]  # fmt: skip
                tasks = [asyncio.ensure_future(http.post("/v1/completions", json=b))
                         for b in bodies]  # fmt: skip
                await asyncio.wait_for(gate.wait(), 10)
                try:
                    # The engine drains nothing while the runner runs: the admitted
                    # wait, the refused answer at once.
                    await _until(lambda: client.num_waiting >= CAP, "the admitted to be sent")
                    await asyncio.sleep(0.2)  # nothing else moves
                    assert client.num_waiting == CAP, peak
                    assert sum(t.done() for t in tasks) == BURST - CAP
                    assert client.num_reserved == 0
                finally:
                    await runner.aclose()  # the engine moves on to the admitted ones
                responses = await asyncio.gather(*tasks)
            watcher.cancel()
            ok = [r for r in responses if r.status_code == 200]
            refused = [r for r in responses if r.status_code != 200]
            assert len(ok) == CAP, [r.text for r in responses]
            assert peak == {"waiting": CAP, "queued": CAP}, peak
            for r in refused:
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                error = r.json()["error"]
                assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
                assert "--max-waiting-requests 3" in error["message"]
            assert all(len(r.json()["choices"][0]["text"]) > 0 for r in ok)
            assert (client.num_waiting, client.num_reserved, client.num_reserved_tokens) == (0,) * 3
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


async def _call_app(app, body: dict, disconnect: bool = False, send_fails: bool = False) -> list:
    """POST ``body`` to /v1/completions straight through ASGI. ``disconnect``:
    the client is gone as soon as the body is read (ASGI spec 2.3, where a
    stream listens for the disconnect); ``send_fails``: every send raises
    ``OSError``, a vanished peer (spec 2.4). Returns the messages sent."""
    data = json.dumps(body).encode()
    spec = "2.4" if send_fails else "2.3"
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/completions",
        "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode())],
        "client": ("127.0.0.1", 1), "server": ("test", 80),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": data, "more_body": False}]
    gone = asyncio.Event()
    if disconnect:
        gone.set()
    sent: list = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg: dict) -> None:
        if send_fails:
            gone.set()
            raise OSError("peer is gone")
        sent.append(msg)

    try:
        await app(scope, receive, send)
    except Exception:  # the failed send surfaces as ClientDisconnect
        pass
    return sent


def test_requests_that_never_reach_the_engine_give_their_room_back(
    fake_model_dir, tokenizer, tmp_path
):
    model = _model(fake_model_dir, tmp_path, step_delay=0.02, max_running=1)

    async def main() -> None:
        client = _client(model, max_waiting_requests=1)
        await client.start()
        try:
            app = build_app(client, tokenizer, "fake")
            body = {"prompt": [5, 6], "max_tokens": 2, "n": 2}
            for kw in ({"disconnect": True}, {"send_fails": True}):
                for stream in (False, True):
                    await _call_app(app, {**body, "stream": stream}, **kw)
                    assert client.num_reserved == 0, (kw, stream)
                    await _until(lambda: client.num_waiting == 0, "the aborts")
            # The cap is whole: one request is admitted, a second is not.
            r = client.check_capacity(1, 2)
            with pytest.raises(EngineOverloadedError):
                client.check_capacity(1, 2)
            r.release()
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))
