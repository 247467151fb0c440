"""Where the ZeroMQ client protocol listens: the default endpoint and the
checks made before anything is loaded (docs/protocol.md, "Address")."""

from __future__ import annotations

import os
import socket
import tempfile

import zmq


def default_zmq_address(http_port: int) -> str:
    """``ipc://<tmpdir>/paternoster-<http_port>.ipc``: one socket per server."""
    return f"ipc://{tempfile.gettempdir()}/paternoster-{http_port}.ipc"


def check_address(address: str) -> None:
    """Refuse an endpoint that cannot be served before anything is loaded.

    ZeroMQ binding an ``ipc://`` path replaces a socket file that another
    server still listens on; this refuses such a path instead (a stale file,
    one nobody accepts on, is fine).

    Raises:
        ValueError: not ``tcp://HOST:PORT`` or ``ipc://PATH``, a TCP endpoint
            that cannot be bound, or an ``ipc://`` path another process serves.
    """
    if address.startswith("ipc://") and len(address) > len("ipc://"):
        path = address[len("ipc://"):]
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                return  # nobody listens: a stale file from a server that died
            finally:
                probe.close()
            raise ValueError(f"{address} is in use by another process (another server?)")
        return
    if not address.startswith("tcp://"):
        raise ValueError(f"ZeroMQ endpoint must be tcp://HOST:PORT or ipc://PATH, got {address!r}")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        sock.bind(address)
    except zmq.ZMQError as e:
        raise ValueError(f"cannot listen on {address}: {e}") from None
    finally:
        sock.close(0)
        ctx.term()
