"""The msgpack wire codec and typed ZeroMQ queues.

Every message on a Paternoster socket is one ZeroMQ frame holding one msgpack
map with string keys. Maps carry ``"v"`` (protocol version) and ``"type"``.
Nothing is ever pickled. Decoding checks the frame size *before* parsing and
turns every kind of malformed frame into :class:`CodecError`, so a bad peer can
make us drop a message but never crash a loop.

Two levels: :func:`encode` / :func:`decode` handle plain maps (the Python
clients of the public protocol use them); :class:`MessageCodec` encodes the
engine link's msgspec Structs once and decodes a frame straight into the
struct its ``"type"`` names (:mod:`paternoster.engine.messages`). The queues
wrap a socket so that the rest of the code sends and receives typed messages,
never bytes (after mini-sglang's ``PushQueue``/``PullQueue``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import msgspec
import zmq
import zmq.asyncio

from paternoster.engine.messages import LINK_VERSION

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024


class CodecError(ValueError):
    """A frame that is not a valid Paternoster message (garbage, truncated,
    oversized, not a map, non-string keys, ext types, wrong version, a field
    of the wrong type). ``frame`` holds the refused frame when a typed decode
    failed on a well-sized one (to salvage an id for an error reply), else
    ``None``."""

    frame: bytes | None = None


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


class MessageCodec:
    """Encodes link messages (msgspec Structs) and decodes frames into them.

    Args:
        decodes: the message type, or a ``Union`` of tagged message types,
            that :meth:`decode` accepts (e.g. :data:`~paternoster.engine.messages.ToEngine`).
        max_frame_bytes: the largest frame either direction handles.
    """

    def __init__(self, decodes: Any, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_plain)
        self._decoder = msgspec.msgpack.Decoder(decodes)

    def encode(self, msg: msgspec.Struct) -> bytes:
        """One frame for ``msg``.

        Raises:
            CodecError: a value msgpack cannot hold, or a frame over
                ``max_frame_bytes``.
        """
        try:
            frame = self._encoder.encode(msg)
        except (TypeError, ValueError, OverflowError) as e:
            raise CodecError(f"cannot encode message: {e}") from e
        if len(frame) > self.max_frame_bytes:
            raise CodecError(
                f"encoded message is {len(frame)} bytes, over the {self.max_frame_bytes} limit"
            )
        return frame

    def decode(self, frame: bytes | memoryview) -> Any:
        """The typed message in ``frame``.

        Raises:
            CodecError: oversized (checked before parsing), not valid msgpack,
                an unknown ``"type"``, a field missing or of the wrong type, or
                another link version.
        """
        if len(frame) > self.max_frame_bytes:
            raise CodecError(f"frame is {len(frame)} bytes, over the {self.max_frame_bytes} limit")
        try:
            msg = self._decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            error = CodecError(f"malformed message: {e}")
            error.frame = bytes(frame)
            raise error from e
        version = getattr(msg, "v", None)
        if version != LINK_VERSION:
            raise CodecError(f"engine link version {version!r}, expected {LINK_VERSION}")
        return msg


class PushQueue:
    """Sends typed messages on a blocking ZeroMQ PUSH socket.

    Args:
        socket: a connected or bound ``zmq.PUSH`` socket (not asyncio).
        codec: encodes what :meth:`put` sends.
    """

    def __init__(self, socket: zmq.Socket, codec: MessageCodec):
        self.socket = socket
        self.codec = codec

    def put(self, msg: msgspec.Struct) -> None:
        """Encode and send one message (blocks while the peer's queue is full).

        Raises:
            CodecError: the message cannot be encoded.
            zmq.ZMQError: the socket failed.
        """
        self.socket.send(self.codec.encode(msg), copy=False)


class PullQueue:
    """Receives typed messages from a blocking ZeroMQ PULL socket.

    Args:
        socket: a ``zmq.PULL`` socket (not asyncio).
        codec: decodes what arrives (frames over its ``max_frame_bytes`` are
            also dropped early by ZeroMQ's ``MAXMSGSIZE``).
    """

    def __init__(self, socket: zmq.Socket, codec: MessageCodec):
        self.socket = socket
        self.codec = codec
        socket.setsockopt(zmq.MAXMSGSIZE, codec.max_frame_bytes)

    def poll(self, timeout_ms: int) -> bool:
        """True when a frame is ready within ``timeout_ms`` milliseconds (0: don't wait)."""
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def get(self) -> Any:
        """Receive and decode one message (blocks until one arrives).

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        frame = self.socket.recv(copy=False)
        return self.codec.decode(frame.buffer)

    def get_nowait(self) -> Any | None:
        """One message if a frame is already waiting, else ``None``.

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        try:
            frame = self.socket.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        return self.codec.decode(frame.buffer)


class AsyncPushQueue:
    """:class:`PushQueue` for a ``zmq.asyncio`` PUSH socket."""

    def __init__(self, socket: zmq.asyncio.Socket, codec: MessageCodec):
        self.socket = socket
        self.codec = codec

    async def put(self, msg: msgspec.Struct) -> None:
        """Encode and send one message.

        Raises:
            CodecError: the message cannot be encoded.
        """
        await self.socket.send(self.codec.encode(msg), copy=False)


class AsyncPullQueue:
    """:class:`PullQueue` for a ``zmq.asyncio`` PULL socket."""

    def __init__(self, socket: zmq.asyncio.Socket, codec: MessageCodec):
        self.socket = socket
        self.codec = codec
        socket.setsockopt(zmq.MAXMSGSIZE, codec.max_frame_bytes)

    async def get(self) -> Any:
        """Receive and decode one message.

        Raises:
            CodecError: the frame was malformed (the frame is consumed).
        """
        frame = await self.socket.recv(copy=False)
        return self.codec.decode(frame.buffer)
