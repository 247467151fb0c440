"""The engine link over tcp is ZeroMQ CURVE (paternoster.engine.curve): a
keyed engine's messages go through both ways, a peer without the keys (plain
ZeroMQ, its own keypair, the wrong server key) gets nothing through either
way, the bytes on the wire are not the messages, a tcp link never starts in
plain text, and ipc links have no CURVE. The end-to-end test runs a real
engine process over tcp with the same keys a Ray actor gets (no Ray needed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
import zmq

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.codec import MessageCodec, PullQueue, PushQueue
from paternoster.engine.curve import CURVE_KEYS_ENV, EngineKeys, LinkKeys
from paternoster.engine.messages import Config, EngineCoreRequest, FromEngine, Ready, ToEngine
from paternoster.engine.process import run_engine
from paternoster.frontend.engine_client import EngineClient
from paternoster.frontend.launcher import LocalLauncher
from paternoster.frontend.link import EngineLink
from paternoster.sampling_params import SamplingParams

FAKE_ENGINE = "tests.entrypoints.fake_engine:FakeEngineCore"
CANARY = "plaintext-canary-7f3a"
#: How long a peer that should get nothing is given to get something, ms.
QUIET_MS = 500


def _engine_end(ctx: zmq.Context, link: EngineLink,
                keys: EngineKeys | None) -> tuple[PullQueue, PushQueue]:  # fmt: skip
    """The engine's two sockets connected to ``link``, CURVE clients with
    ``keys`` (``None``: plain ZeroMQ)."""
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            keys.apply(sock)
    pull.connect(link.input_address)
    push.connect(link.output_address)
    return PullQueue(pull, MessageCodec(ToEngine)), PushQueue(push, MessageCodec(FromEngine))


def _other_keypair(keys: EngineKeys) -> EngineKeys:
    public, secret = zmq.curve_keypair()
    return EngineKeys(keys.server_public, public.decode(), secret.decode())


def _wrong_server(keys: EngineKeys) -> EngineKeys:
    return EngineKeys(zmq.curve_keypair()[0].decode(), keys.public, keys.secret)


def test_a_tcp_link_carries_messages_both_ways_for_the_keyed_engine():
    async def main() -> None:
        link = EngineLink({})
        link.bind("127.0.0.1")
        ctx = zmq.Context()
        try:
            assert link.input_address.startswith("tcp://127.0.0.1:")
            inputs, outputs = _engine_end(ctx, link, link.engine_keys)
            await link.send_now(Config(config={"who": CANARY}, token="t"))
            assert inputs.poll(10_000)
            assert inputs.get() == Config(config={"who": CANARY}, token="t")
            outputs.put(Ready(info={"model": "m"}, token="t"))
            got = await asyncio.wait_for(link.receive(), 10)
            assert got == Ready(info={"model": "m"}, token="t")
        finally:
            ctx.destroy(linger=0)
            await link.close()

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("intruder", ["plain", "own keypair", "wrong server key"])
def test_a_peer_without_the_keys_gets_nothing_through(intruder, caplog):
    """The intruder connects first and queues a Ready; the keyed engine then
    gets every frontend message (none goes to the intruder) and the frontend
    gets only the engine's message."""
    caplog.set_level(logging.WARNING, "paternoster.engine")

    async def main() -> None:
        link = EngineLink({})
        link.bind("127.0.0.1")
        ctx = zmq.Context()
        try:
            keys = link.engine_keys
            bad = {"plain": None, "own keypair": _other_keypair(keys),
                   "wrong server key": _wrong_server(keys)}[intruder]  # fmt: skip
            bad_in, bad_out = _engine_end(ctx, link, bad)
            bad_out.put(Ready(info={"model": "impostor"}, token="t"))  # queued, never delivered
            inputs, outputs = _engine_end(ctx, link, keys)
            for i in range(4):  # a PUSH deals round-robin: a connected intruder would get some
                await link.send_now(Config(config={"i": i}, token="t"))
            for i in range(4):
                assert inputs.poll(10_000)
                assert inputs.get().config == {"i": i}
            outputs.put(Ready(info={"model": "engine"}, token="t"))
            got = await asyncio.wait_for(link.receive(), 10)
            assert got.info == {"model": "engine"}
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(link.receive(), QUIET_MS / 1000)
            assert not bad_in.poll(QUIET_MS)
            if intruder == "own keypair":  # it got past CURVE to ZAP, which refused it
                deadline = time.monotonic() + 10
                while "refused a CURVE client" not in caplog.text and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert "refused a CURVE client" in caplog.text
        finally:
            ctx.destroy(linger=0)
            await link.close()

    asyncio.run(asyncio.wait_for(main(), 60))


class _Tap:
    """A TCP relay from a local port to ``target`` that keeps every byte it
    relays, both ways (one connection)."""

    def __init__(self, target: str):
        host, port = target[len("tcp://"):].rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.seen = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            down, _ = self.server.accept()
            up = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(down, up), daemon=True).start()
            self._pump(up, down)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self.lock:
                    self.seen += data
                dst.sendall(data)

    def bytes(self) -> bytes:
        with self.lock:
            return bytes(self.seen)


def test_the_bytes_on_the_wire_are_not_the_messages():
    async def main() -> None:
        link = EngineLink({})
        link.bind("127.0.0.1")
        tap = _Tap(link.input_address)
        ctx = zmq.Context()
        try:
            pull = ctx.socket(zmq.PULL)
            pull.setsockopt(zmq.LINGER, 0)
            link.engine_keys.apply(pull)
            pull.connect(tap.address)  # through the relay
            inputs = PullQueue(pull, MessageCodec(ToEngine))
            await link.send_now(Config(config={"secret": CANARY}, token="t"))
            assert inputs.poll(10_000)
            assert inputs.get().config == {"secret": CANARY}
            wire = tap.bytes()
            assert b"CURVE" in wire  # the ZMTP greeting names the mechanism
            assert CANARY.encode() not in wire and b"config" not in wire
        finally:
            ctx.destroy(linger=0)
            await link.close()
            tap.server.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_ipc_link_has_no_curve():
    async def main() -> None:
        ipc, tcp = EngineLink({}), EngineLink({})
        ipc.bind(None)
        tcp.bind("127.0.0.1")
        try:
            assert ipc.engine_keys is None and tcp.engine_keys is not None
            for link, mechanism in ((ipc, zmq.NULL), (tcp, zmq.CURVE)):
                for queue in (link._push, link._pull):
                    assert queue.socket.getsockopt(zmq.MECHANISM) == mechanism
        finally:
            await ipc.close()
            await tcp.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_each_link_has_its_own_keys():
    async def main() -> None:
        a, b = EngineLink({}), EngineLink({})
        a.bind("127.0.0.1")
        b.bind("127.0.0.1")
        try:
            ka, kb = a.engine_keys, b.engine_keys
            assert len({ka.server_public, kb.server_public, ka.public, kb.public}) == 4
            assert ka.secret not in repr(ka)
        finally:
            await a.close()
            await b.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_without_curve_a_tcp_link_refuses_to_start(monkeypatch):
    keys = LinkKeys().engine
    has = zmq.has
    monkeypatch.setattr(zmq, "has", lambda feature: feature != "curve" and has(feature))
    link = EngineLink({})
    with pytest.raises(ValueError, match="CURVE"):
        link.bind("127.0.0.1")
    link.bind(None)  # ipc does not need it
    asyncio.run(link.close())
    from paternoster.frontend.ray_executor import RayLauncher

    with pytest.raises(ValueError, match="CURVE"):  # before Ray is even looked for
        RayLauncher(1, num_cpus=1)
    assert run_engine("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", token="t", keys=keys) == 1


def test_an_engine_refuses_a_tcp_link_without_keys(monkeypatch, caplog):
    monkeypatch.delenv(CURVE_KEYS_ENV, raising=False)
    assert run_engine("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", token="t") == 1
    assert "refusing to connect in plain text" in caplog.text


class _TcpLocalLauncher(LocalLauncher):
    """A local engine process linked over tcp, as a Ray actor is."""

    bind_host = "127.0.0.1"


def test_an_engine_process_serves_over_a_curve_link(tmp_path):
    """The keys reach a local child in its environment, never on its command
    line; the engine connects with them and serves a request."""
    (tmp_path / "fake_engine.json").write_text('{"tokens": [11, 12, 13]}')

    async def main() -> None:
        client = EngineClient(EngineConfig(ModelConfig(str(tmp_path))), engine_cls=FAKE_ENGINE,
                              startup_timeout=30, launcher=_TcpLocalLauncher())  # fmt: skip
        await client.start()
        try:
            assert client.link.input_address.startswith("tcp://")
            keys = client.link.engine_keys
            proc = Path(f"/proc/{client.pid}")
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
            assert keys.secret.encode() not in cmdline
            assert f"{CURVE_KEYS_ENV}={keys.to_env()}".encode() in environ
            request = EngineCoreRequest("r1", [1, 2, 3], SamplingParams(max_tokens=3))
            got = [t async for out in client.generate(request) for t in out.new_token_ids]
            assert got == [11, 12, 13]
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))
