"""Fixtures of the client-protocol tests: servers over the fake engine (real
tokenizer, no model) that echo each request's prompt tokens back as its
output, with the ZeroMQ client protocol on a free TCP port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.entrypoints.utils import Server, free_port
from tests.hardening.conftest import fake_model_dir, fake_server, tokenizer  # noqa: F401


@dataclass
class ZmqServer:
    """A running server: HTTP (``http``) and its ZeroMQ endpoint (``address``)."""

    http: Server
    address: str


@contextlib.contextmanager
def zmq_server(model_dir: Path, opts: dict | None = None, *args: str,
               address: str | None = None) -> Iterator[ZmqServer]:  # fmt: skip
    """A fake-engine server (``echo_prompt`` on, plus ``opts``) listening on
    ``address`` (default ``tcp://127.0.0.1:<free port>``); ``args`` are extra
    ``serve`` flags."""
    address = address or f"tcp://127.0.0.1:{free_port()}"
    engine_opts = {"echo_prompt": True, **(opts or {})}
    with fake_server(model_dir, engine_opts, "--zmq-address", address, *args) as srv:
        yield ZmqServer(srv, address)


@pytest.fixture(scope="module")
def server(fake_model_dir) -> Iterator[ZmqServer]:  # noqa: F811
    """One shared server whose steps take 5 ms."""
    with zmq_server(fake_model_dir, {"step_delay": 0.005}, "--max-num-seqs", "256") as srv:
        yield srv
