"""The msgpack wire codec and typed ZeroMQ queues.

Every message on a Paternoster socket is one ZeroMQ frame holding one msgpack
map with string keys. Maps carry ``"v"`` (protocol version) and ``"type"``.
Nothing is ever pickled. Decoding checks the frame size *before* parsing and
turns every kind of malformed frame into :class:`CodecError`, so a bad peer can
make us drop a message but never crash a loop.

The queues wrap a socket so that the rest of the code sends and receives maps,
never bytes (after mini-sglang's ``PushQueue``/``PullQueue``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import zmq
import zmq.asyncio

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


class CodecError(ValueError):
    """A frame that is not a valid Paternoster message (garbage, truncated,
    oversized, not a map, non-string keys, ext types, wrong version)."""


def _reject_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack ext type {code} is not allowed on the wire")


def _plain(obj: Any) -> Any:
    """msgpack fallback: numpy scalars and arrays travel as plain numbers and lists."""
    for attr in ("tolist", "item"):
        fn = getattr(obj, attr, None)
        if callable(fn):
            return fn()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def encode(msg: Mapping[str, Any], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Serialize one message map.

    Args:
        msg: map with ``str`` keys; values are None, bool, int, float, str,
            bytes, lists and maps of those (numpy scalars and arrays are
            converted to numbers and lists).
        max_frame_bytes: refuse to produce a larger frame.
    Returns:
        The msgpack frame (bytes).
    Raises:
        CodecError: ``msg`` is not a map, holds an unsupported type, or
            encodes to more than ``max_frame_bytes``.
    """
    if not isinstance(msg, Mapping):
        raise CodecError(f"a message must be a map, got {type(msg).__name__}")
    try:
        frame = msgpack.packb(msg, use_bin_type=True, default=_plain)
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"cannot encode message: {e}") from e
    if len(frame) > max_frame_bytes:
        raise CodecError(f"encoded message is {len(frame)} bytes, over the {max_frame_bytes} limit")
    return frame


def decode(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict:
    """Parse one frame into a message map.

    Args:
        frame: the raw bytes of one ZeroMQ frame.
        max_frame_bytes: frames longer than this are rejected before parsing.
    Returns:
        The decoded map (``dict`` with ``str`` keys).
    Raises:
        CodecError: oversized, empty, truncated or trailing bytes, invalid
            msgpack or UTF-8, non-map top level, non-string map keys, ext
            types, or a ``"v"`` other than :data:`PROTOCOL_VERSION`.
    """
    msg = unpack(frame, max_frame_bytes)
    version = msg.get("v", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise CodecError(f"unsupported protocol version {version!r} (expected {PROTOCOL_VERSION})")
    return msg


def unpack(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict:
    """Parse one frame into a map with string keys, without looking at ``"v"``
    (for protocols that answer a version mismatch themselves).

    Args:
        frame: the raw bytes of one ZeroMQ frame.
        max_frame_bytes: frames longer than this are rejected before parsing.
    Returns:
        The decoded map.
    Raises:
        CodecError: as :func:`decode`, except for the version check.
    """
    size = len(frame)
    if size > max_frame_bytes:
        raise CodecError(f"frame is {size} bytes, over the {max_frame_bytes} limit")
    if size == 0:
        raise CodecError("empty frame")
    try:
        msg = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, use_list=True, ext_hook=_reject_ext
        )
    except CodecError:
        raise
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, ValueError...)
        reason = str(e) or "not valid msgpack"
        raise CodecError(f"malformed frame: {type(e).__name__}: {reason}") from e
    if not isinstance(msg, dict):
        raise CodecError(f"a message must be a map, got {type(msg).__name__}")
    if not all(isinstance(k, str) for k in msg):
        raise CodecError("message keys must be strings")
    return msg


def message(type_: str, **fields: Any) -> dict:
    """Build a message map ``{"v": PROTOCOL_VERSION, "type": type_, **fields}``."""
    return {"v": PROTOCOL_VERSION, "type": type_, **fields}


def message_type(msg: Mapping[str, Any]) -> str:
    """The ``"type"`` of a decoded message.

    Raises:
        CodecError: the map has no string ``"type"``.
    """
    t = msg.get("type")
    if not isinstance(t, str):
        raise CodecError("message has no string 'type'")
    return t


class PushQueue:
    """Sends message maps on a blocking ZeroMQ PUSH socket.

    Args:
        socket: a connected or bound ``zmq.PUSH`` socket (not asyncio).
        max_frame_bytes: largest frame :meth:`put` will send.
    """

    def __init__(self, socket: zmq.Socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.socket = socket
        self.max_frame_bytes = max_frame_bytes

    def put(self, msg: Mapping[str, Any]) -> None:
        """Encode and send one message (blocks while the peer's queue is full).

        Raises:
            CodecError: the message cannot be encoded.
            zmq.ZMQError: the socket failed.
        """
        self.socket.send(encode(msg, self.max_frame_bytes), copy=False)


class PullQueue:
    """Receives message maps from a blocking ZeroMQ PULL socket.

    Args:
        socket: a ``zmq.PULL`` socket (not asyncio).
        max_frame_bytes: frames above this are rejected (also set as the
            socket's ``MAXMSGSIZE`` so ZeroMQ drops them early).
    """

    def __init__(self, socket: zmq.Socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.socket = socket
        self.max_frame_bytes = max_frame_bytes
        socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)

    def poll(self, timeout_ms: int) -> bool:
        """True when a frame is ready within ``timeout_ms`` milliseconds (0: don't wait)."""
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def get(self) -> dict:
        """Receive and decode one message (blocks until one arrives).

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        frame = self.socket.recv(copy=False)
        return decode(frame.buffer, self.max_frame_bytes)

    def get_nowait(self) -> dict | None:
        """One message if a frame is already waiting, else ``None``.

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        try:
            frame = self.socket.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        return decode(frame.buffer, self.max_frame_bytes)


class AsyncPushQueue:
    """:class:`PushQueue` for a ``zmq.asyncio`` PUSH socket."""

    def __init__(self, socket: zmq.asyncio.Socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.socket = socket
        self.max_frame_bytes = max_frame_bytes

    async def put(self, msg: Mapping[str, Any]) -> None:
        """Encode and send one message.

        Raises:
            CodecError: the message cannot be encoded.
        """
        await self.socket.send(encode(msg, self.max_frame_bytes), copy=False)


class AsyncPullQueue:
    """:class:`PullQueue` for a ``zmq.asyncio`` PULL socket."""

    def __init__(self, socket: zmq.asyncio.Socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.socket = socket
        self.max_frame_bytes = max_frame_bytes
        socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)

    async def get(self) -> dict:
        """Receive and decode one message.

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        frame = await self.socket.recv(copy=False)
        return decode(frame.buffer, self.max_frame_bytes)
