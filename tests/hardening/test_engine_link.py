"""The frontend-engine link: the config handshake's token (each side drops a
handshake message without it; the engine gets it in its environment, never on
its command line), and no pickle anywhere in the package but the pipes to
worker processes a process started itself (PICKLE_ALLOWED)."""

from __future__ import annotations

import ast
import asyncio
import shutil
from pathlib import Path

import msgpack
import zmq

from paternoster.config import EngineConfig, ModelConfig
from paternoster.engine.codec import MessageCodec, PullQueue, PushQueue
from paternoster.engine.messages import (
    LINK_VERSION,
    Config,
    Ready,
    Shutdown,
    StartupError,
    ToEngine,
)
from paternoster.engine.process import _wait_for_config
from paternoster.frontend.engine_client import EngineClient
from tests.entrypoints.utils import REPO_ROOT
from tests.hardening.conftest import QUEUEING_ENGINE

TOKEN = "0123456789abcdef0123456789abcdef"


def test_engine_drops_a_config_without_the_token(tmp_path):
    ctx = zmq.Context()
    try:
        push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
        for s in (push, pull):
            s.setsockopt(zmq.LINGER, 0)
        pull.bind(f"ipc://{tmp_path}/in")
        push.connect(f"ipc://{tmp_path}/in")
        push.send(msgpack.packb({"v": LINK_VERSION, "type": "config", "config": {"who": "no"}}))
        out = PushQueue(push, MessageCodec(ToEngine))
        out.put(Config(config={"who": "wrong token"}, token="f" * 32))
        out.put(Shutdown())  # not even a shutdown gets through before the config
        out.put(Config(config={"who": "frontend"}, token=TOKEN))
        assert _wait_for_config(PullQueue(pull, MessageCodec(ToEngine)), None, TOKEN) == {
            "who": "frontend"
        }
    finally:
        ctx.destroy(linger=0)


class _Scripted:
    """Stands in for the supervisor's link: ``receive`` returns the scripted
    engine messages in turn, ``send_now`` records what the frontend sends."""

    def __init__(self, incoming: list):
        self.incoming = incoming
        self.sent: list = []

    async def receive(self):
        return self.incoming.pop(0)

    async def send_now(self, msg) -> None:
        self.sent.append(msg)


def test_frontend_drops_a_ready_without_the_token():
    client = EngineClient(EngineConfig(ModelConfig("unused")))
    token = client.supervisor.token
    link = _Scripted([
        Ready(info={"model": "impostor"}, token=""),
        StartupError(error="impostor", token="f" * 32),
        Ready(info={"model": "impostor"}, token="f" * 32),
        Ready(info={"model": "real"}, token=token),
    ])  # fmt: skip
    client.supervisor.link = link
    handshake = client.supervisor._handshake()
    assert asyncio.run(asyncio.wait_for(handshake, 10)) == {"model": "real"}
    (config,) = link.sent
    assert isinstance(config, Config) and config.token == token
    assert len(token) == 32  # 128 random bits


def test_token_is_in_the_engine_environment_not_its_command_line(fake_model_dir, tmp_path):
    model = shutil.copytree(fake_model_dir, tmp_path / "model")

    async def main() -> None:
        client = EngineClient(EngineConfig(ModelConfig(str(model))), engine_cls=QUEUEING_ENGINE,
                              startup_timeout=30)  # fmt: skip
        await client.start()
        try:
            proc = Path(f"/proc/{client.pid}")
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            token = client.supervisor.token.encode()
            assert not any(token in arg for arg in cmdline), cmdline
            assert b"PATERNOSTER_ENGINE_TOKEN=" + token in environ
        finally:
            await client.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal",
                  "joblib"}  # fmt: skip
PICKLE_CALLS = {"send_pyobj", "recv_pyobj", "send_serialized", "recv_serialized"}


def _pickle_uses(path: Path) -> list[str]:
    """Imports of pickle-like modules, pyzmq's pickling calls, ``torch.load``
    without ``weights_only=True`` and ``allow_pickle=True`` in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module.split(".")[0]]
        found += [f"import {n}" for n in names if n in PICKLE_MODULES]
        if isinstance(node, ast.Attribute) and node.attr in PICKLE_CALLS:
            found.append(node.attr)
        if isinstance(node, ast.Call):
            kw = {k.arg: k.value for k in node.keywords}
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "load"
                    and isinstance(f.value, ast.Name) and f.value.id == "torch"):  # fmt: skip
                weights_only = kw.get("weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    found.append("torch.load without weights_only=True")
            allow = kw.get("allow_pickle")
            if isinstance(allow, ast.Constant) and allow.value is True:
                found.append("allow_pickle=True")
    return [f"{path.relative_to(REPO_ROOT)}:{u}" for u in found]


#: The one place pickle is allowed: frames on the anonymous stdin/stdout pipes
#: between a process and the worker processes it started itself (tensor-parallel
#: ranks, offline data-parallel engines). No socket, no other peer: whoever can
#: write to those pipes already runs code as that process.
PICKLE_ALLOWED = {"python/paternoster/engine/pipe_worker.py:import pickle"}


def test_nothing_is_pickled_anywhere():
    files = [p for d in ("python", "schedulers", "bench") for p in (REPO_ROOT / d).rglob("*.py")]
    assert len(files) > 50
    uses = [u for p in files for u in _pickle_uses(p)]
    assert [u for u in uses if u not in PICKLE_ALLOWED] == []
