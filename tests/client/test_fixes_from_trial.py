"""Behaviours found by a fresh user's trial of the client protocol: an abort
right behind its generate, logit_bias pairs, the shutdown drain of ZeroMQ
requests, a second server on the same ipc path, and a client that survives a
server restart."""

from __future__ import annotations

import signal
import socket
import threading

import msgpack
import pytest
import zmq

from paternoster.client import Client
from paternoster.entrypoints.zmq_address import check_address
from tests.client.conftest import zmq_server
from tests.client.test_raw_protocol import Raw
from tests.entrypoints.utils import free_port, start_server


def test_abort_right_behind_generate_still_gets_a_final(server):
    c = Raw(server.address)
    try:
        for i in range(20):
            gen = msgpack.packb({"v": 1, "type": "generate", "id": f"q{i}",
                                 "prompt_token_ids": [3], "sampling": {"max_tokens": 200}})
            abort = msgpack.packb({"v": 1, "type": "abort", "id": f"q{i}"})
            c.sock.send(gen)
            c.sock.send(abort)  # in the same socket read: the task has not run yet
        finals = {}
        while len(finals) < 20:
            m = c.recv()
            if m["type"] != "delta":
                finals[m["id"]] = m
        assert {m["type"] for m in finals.values()} == {"final"}
        assert {m["finish_reason"] for m in finals.values()} == {"abort"}
        # nothing is left in flight on the connection: the ids are free again
        c.send({"type": "generate", "id": "q0", "prompt_token_ids": [4], "stream": False,
                "sampling": {"max_tokens": 2}})  # fmt: skip
        assert c.run("q0")[1]["token_ids"] == [4, 4]
    finally:
        c.close()


def test_closing_many_streams_at_once_leaks_no_slot(server):
    with Client(server.address, timeout=10) as c:
        for _ in range(40):
            c.stream(prompt_token_ids=[1], max_tokens=50).close()
        server.http.wait_for(lambda s: s["num_in_flight"] == 0, what="aborts done")
        assert c.generate(prompt_token_ids=[2], max_tokens=3).token_ids == [2, 2, 2]
        c.health()
        assert not c._draining  # every aborted request's final came back


def test_logit_bias_pairs_and_dict(raw_server_address):
    c = Raw(raw_server_address)
    try:
        c.send({"type": "generate", "id": "b", "prompt_token_ids": [9], "stream": False,
                "sampling": {"max_tokens": 2, "logit_bias": [[1, 5.0], [2, -3]]}})  # fmt: skip
        assert c.run("b")[1]["type"] == "final"
        for bad, why in (([[1]], "pair"), ([[10**7, 1.0]], "vocabulary"), ([[1, 500.0]], "range")):
            c.send({"type": "generate", "id": "bad", "prompt_token_ids": [9],
                    "sampling": {"logit_bias": bad}})
            e = c.recv()
            assert (e["code"], e["param"]) == ("bad_request", "sampling.logit_bias"), (why, e)
    finally:
        c.close()
    with Client(raw_server_address, timeout=10) as client:
        assert client.generate(prompt_token_ids=[9], max_tokens=1, logit_bias={1: 5.0}).token_ids


@pytest.fixture()
def raw_server_address(server):
    return server.address


def test_sigterm_drains_zeromq_requests(fake_model_dir):
    with zmq_server(fake_model_dir, {"step_delay": 0.05}, "--shutdown-timeout", "1.5") as srv:
        results: dict = {}

        def run(name: str, max_tokens: int) -> None:
            with Client(srv.address, timeout=15) as c:
                try:
                    results[name] = c.generate(prompt_token_ids=[5], max_tokens=max_tokens)
                except Exception as e:
                    results[name] = e

        threads = [threading.Thread(target=run, args=("short", 12)),
                   threading.Thread(target=run, args=("long", 200))]  # fmt: skip
        for t in threads:
            t.start()
        srv.http.wait_for(lambda s: s["num_in_flight"] == 2, what="2 in flight")
        srv.http.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(15)
        assert srv.http.proc.wait(15) == 0
    short, long_ = results["short"], results["long"]
    assert not isinstance(short, Exception), short  # finished within the drain
    assert short.finish_reason == "length" and short.token_ids == [5] * 12
    assert getattr(long_, "code", None) == "engine_unavailable", long_  # cut at the timeout
    assert "shutting down" in str(long_)


def test_ipc_path_of_a_live_server_is_refused(tmp_path):
    path = tmp_path / "live.ipc"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    try:
        with pytest.raises(ValueError, match="in use"):
            check_address(f"ipc://{path}")
    finally:
        listener.close()
    check_address(f"ipc://{path}")  # the file is stale now: fine
    check_address(f"ipc://{tmp_path / 'new.ipc'}")
    with pytest.raises(ValueError, match="tcp://HOST:PORT or ipc://PATH"):
        check_address("foo")
    busy = zmq.Context().socket(zmq.ROUTER)
    port = busy.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(ValueError, match="cannot listen"):
            check_address(f"tcp://127.0.0.1:{port}")
    finally:
        busy.close(0)


def test_second_server_on_the_same_ipc_path_exits_and_leaves_the_first_alone(fake_model_dir,
                                                                             tmp_path):
    address = f"ipc://{tmp_path / 'shared.ipc'}"
    with zmq_server(fake_model_dir, {}, address=address):
        with pytest.raises(RuntimeError, match="exited with code 1"):
            with start_server(str(fake_model_dir), "--engine-cls",
                              "tests.entrypoints.fake_engine:FakeEngineCore",
                              "--zmq-address", address, timeout=60):  # fmt: skip
                pass
        with Client(address, timeout=10) as c:
            assert c.health()["status"] == "ok"


def test_client_survives_a_server_restart(fake_model_dir):
    address = f"tcp://127.0.0.1:{free_port()}"
    with zmq_server(fake_model_dir, {}, address=address):
        c = Client(address, timeout=10)
        assert c.generate(prompt_token_ids=[1], max_tokens=1).token_ids == [1]
    try:
        with zmq_server(fake_model_dir, {}, address=address):
            # ZeroMQ reconnects by itself; the new server has never seen this
            # connection, so the client greets it again and resends the request
            assert c.generate(prompt_token_ids=[2], max_tokens=2).token_ids == [2, 2]
    finally:
        c.close()
