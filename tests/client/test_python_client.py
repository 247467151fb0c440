"""``paternoster.client``: the blocking and the asyncio client against a
fake-engine server that echoes each prompt's tokens back (so every request's
expected output is known)."""

from __future__ import annotations

import asyncio
import random

import pytest

from paternoster.client import (
    AsyncClient,
    BadRequestError,
    Client,
    EngineUnavailableError,
    OverloadedError,
    ProtocolError,
)
from tests.client.conftest import zmq_server


def _expected(prompt: list[int], n: int) -> list[int]:
    return [prompt[i % len(prompt)] for i in range(n)]


@pytest.fixture()
def client(server):
    with Client(server.address, timeout=10) as c:
        yield c


def _idle(server) -> dict:
    return server.http.wait_for(
        lambda s: s["num_in_flight"] == 0 and s["engine"]["num_running"] == 0, what="idle"
    )


# ------------------------------------------------------------------ sync


def test_sync_generate_and_stream_agree(client, tokenizer):
    prompt = [321, 654, 987]
    done = client.generate(prompt_token_ids=prompt, max_tokens=11)
    assert done.token_ids == _expected(prompt, 11) and done.finish_reason == "length"
    assert done.text == tokenizer.decode(done.token_ids)
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 11)
    pieces = list(client.stream(prompt_token_ids=prompt, max_tokens=11))
    assert [t for d in pieces for t in d.token_ids] == done.token_ids
    assert "".join(d.text for d in pieces) == done.text
    assert pieces[-1].finish_reason == "length" and pieces[-1].usage.total_tokens == 14
    assert all(d.finish_reason is None for d in pieces[:-1])


def test_sync_text_prompt_is_tokenized_by_the_server(client, tokenizer):
    text = "Paternoster lifts never stop"
    done = client.generate(text, max_tokens=5)
    assert done.token_ids == _expected(tokenizer(text).input_ids, 5)
    raw = client.generate(text, max_tokens=5, add_special_tokens=False)
    assert raw.token_ids == _expected(tokenizer(text, add_special_tokens=False).input_ids, 5)


def test_sync_streams_interleave_on_one_client(client):
    a = client.stream(prompt_token_ids=[11, 12], max_tokens=30)
    b = client.stream(prompt_token_ids=[21, 22, 23], max_tokens=20)
    got_a, got_b = [], []
    for db in b:  # one piece of each in turn: the other's messages wait in the client
        got_b += db.token_ids
        got_a += next(a).token_ids
    got_a += [t for d in a for t in d.token_ids]
    assert got_a == _expected([11, 12], 30) and got_b == _expected([21, 22, 23], 20)


def test_sync_stream_close_aborts_and_the_id_can_be_reused(server, client):
    s = client.stream(prompt_token_ids=[5], max_tokens=200, request_id="mine")
    next(s)
    with pytest.raises(ValueError, match="already in flight"):
        client.stream(prompt_token_ids=[5], request_id="mine")
    s.close()
    assert list(s) == []
    _idle(server)
    client.health()  # drains the aborted request's final
    again = client.generate(prompt_token_ids=[6], max_tokens=3, request_id="mine")
    assert again.token_ids == [6, 6, 6]


def test_sync_errors_are_typed(client):
    with pytest.raises(BadRequestError) as e:
        client.generate("hi", temperature=-1.0)
    assert e.value.code == "bad_request" and e.value.param == "sampling.temperature"
    with pytest.raises(BadRequestError, match="maximum context length is 256"):
        client.generate(prompt_token_ids=[1] * 250, max_tokens=10)
    with pytest.raises(ValueError, match="unknown sampling fields"):
        client.generate("hi", temprature=0.5)
    with pytest.raises(ValueError, match="exactly one"):
        client.generate()
    assert client.generate("hi", max_tokens=1).finish_reason == "length"  # still fine


def test_sync_timeout_aborts_the_request(fake_model_dir):
    with zmq_server(fake_model_dir, {"step_delay": 0.05}) as srv:
        with Client(srv.address, timeout=10) as c:
            with pytest.raises(TimeoutError):
                c.generate(prompt_token_ids=[1], max_tokens=200, timeout=0.3)
            _idle(srv)  # the server aborted it
            assert c.generate(prompt_token_ids=[2], max_tokens=2).token_ids == [2, 2]


def test_sync_models_health_and_server_info(client):
    assert client.server_info["max_model_len"] == 256
    assert client.models()[0]["max_model_len"] == 256
    assert client.health() == {"status": "ok"}


def test_handshake_errors(fake_model_dir):
    with zmq_server(fake_model_dir, {}, "--api-key", "k") as srv:
        with pytest.raises(ProtocolError) as e:
            Client(srv.address, timeout=5)
        assert e.value.code == "unauthorized"
        with Client(srv.address, api_key="k", timeout=5) as c:
            assert c.health()["status"] == "ok"


def test_connect_to_nothing_times_out():
    from tests.entrypoints.utils import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match=f"no Paternoster server answered the handshake at "
                                           f"{address} within 0.3 s"):  # fmt: skip
        Client(address, timeout=0.3)
    with pytest.raises(TimeoutError, match=f"at {address} within 0.2 s"):
        asyncio.run(AsyncClient.connect(address, timeout=0.2))


@pytest.mark.parametrize("address", ["localhost:5555", "http://127.0.0.1:5555", "tcp://"])
def test_an_address_zeromq_refuses_is_a_value_error_naming_it(address):
    with pytest.raises(ValueError, match=f"got '{address}'"):
        Client(address, timeout=0.3)
    with pytest.raises(ValueError, match="ZeroMQ endpoint such as tcp://"):
        asyncio.run(AsyncClient.connect(address, timeout=0.3))


def test_overload_and_dead_engine_errors(fake_model_dir):
    opts = {"step_delay": 0.05, "max_running": 1}
    with zmq_server(fake_model_dir, opts, "--max-waiting-requests", "1") as srv:
        with Client(srv.address, timeout=10) as c:
            busy = c.stream(prompt_token_ids=[1], max_tokens=100)
            next(busy)
            queued = c.stream(prompt_token_ids=[2], max_tokens=100)
            srv.http.wait_for(lambda s: s["num_waiting"] == 1, what="one request waiting")
            with pytest.raises(OverloadedError) as e:
                c.generate(prompt_token_ids=[3], max_tokens=2)
            assert e.value.code == "overloaded" and e.value.retry_after >= 1
            busy.close()
            queued.close()
    opts = {"step_delay": 0.02, "crash_at_step": 10}
    with zmq_server(fake_model_dir, opts) as srv:
        with Client(srv.address, timeout=10) as c:
            with pytest.raises(EngineUnavailableError):
                list(c.stream(prompt_token_ids=[1], max_tokens=100))
            assert c.health()["status"] == "unhealthy"


# ----------------------------------------------------------------- async


def test_async_generate_stream_abort(server, tokenizer):
    async def run():
        async with await AsyncClient.connect(server.address, timeout=10) as c:
            done = await c.generate(prompt_token_ids=[77, 88], max_tokens=9)
            assert done.token_ids == _expected([77, 88], 9)
            ids = [t async for d in c.stream(prompt_token_ids=[77, 88], max_tokens=9)
                   for t in d.token_ids]  # fmt: skip
            assert ids == done.token_ids
            stream = c.stream(prompt_token_ids=[1], max_tokens=200)
            async for _ in stream:
                break
            await stream.aclose()  # aborts
            task = asyncio.create_task(c.generate(prompt_token_ids=[1], max_tokens=200))
            await asyncio.sleep(0.1)
            task.cancel()  # aborts too
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(BadRequestError):
                await c.generate("x", top_p=0.0)
            assert (await c.health())["status"] == "ok"
            assert (await c.models())[0]["id"]
            with pytest.raises(TimeoutError):
                await c.generate(prompt_token_ids=[3], max_tokens=250, timeout=0.2)

    asyncio.run(run())
    _idle(server)


def test_hundred_concurrent_streams_from_several_clients_get_only_their_own(server, tokenizer):
    """100 streams over 5 connections, all at once: each gets exactly its own
    tokens (its prompt echoed), in order, and its own text."""
    rng = random.Random(0)

    async def one(c: AsyncClient, k: int) -> None:
        prompt = [1000 + 37 * k + j for j in range(rng.randint(1, 6))]
        n = rng.randint(5, 60)
        ids, text = [], []
        rid = f"s{k // 5}"  # the same ids on every connection: they must not mix
        async for d in c.stream(prompt_token_ids=prompt, max_tokens=n, request_id=rid):
            assert d.request_id == rid
            ids += d.token_ids
            text.append(d.text)
        assert ids == _expected(prompt, n), k
        assert "".join(text) == tokenizer.decode(ids)

    async def run():
        clients = [await AsyncClient.connect(server.address, timeout=30) for _ in range(5)]
        try:
            await asyncio.gather(*(one(clients[k % 5], k) for k in range(100)))
        finally:
            for c in clients:
                await c.close()

    asyncio.run(run())
    _idle(server)
