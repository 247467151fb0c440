"""The msgpack wire codec: round trips, and typed errors for every bad frame."""

from __future__ import annotations

import msgpack
import pytest
import zmq

from paternoster.engine.codec import (
    PROTOCOL_VERSION,
    CodecError,
    MessageCodec,
    PullQueue,
    PushQueue,
    decode,
    encode,
    message,
    message_type,
)
from paternoster.engine.messages import (
    Abort,
    Add,
    EngineCoreOutput,
    EngineCoreRequest,
    FromEngine,
    Outputs,
    Shutdown,
    ToEngine,
)
from paternoster.sampling_params import SamplingParams


def test_round_trip_of_request_and_output_messages():
    req = EngineCoreRequest("r1", [1, 2, 3], SamplingParams(temperature=0, stop=["x"],
                                                            logit_bias={5: -1.5}))  # fmt: skip
    out = EngineCoreOutput("r1", [7], "stop", 7, None, 3)
    to_engine, from_engine = MessageCodec(ToEngine), MessageCodec(FromEngine)
    back = to_engine.decode(to_engine.encode(Add(request=req)))
    assert isinstance(back, Add) and back.request == req
    got = from_engine.decode(from_engine.encode(Outputs(outputs=[out], stats={"n": 1})))
    assert isinstance(got, Outputs) and got.outputs == [out] and got.stats == {"n": 1}
    with pytest.raises(CodecError, match="malformed"):  # an engine-bound message this way
        from_engine.decode(to_engine.encode(Add(request=req)))
    assert encode(message("x", blob=b"\x00\xff")) and PROTOCOL_VERSION == 1


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\xff\xfe\xfd garbage",
        msgpack.packb([1, 2, 3]),  # not a map
        msgpack.packb("just a string"),
        msgpack.packb({1: "int key"}, use_bin_type=True),
        msgpack.packb({b"bytes": 1}, use_bin_type=True),  # bin key, not str
        msgpack.packb({"a": 1}) + b"\x01",  # trailing bytes
        msgpack.packb({"a": msgpack.ExtType(5, b"xx")}),
        msgpack.packb({"v": 99, "type": "add"}),
        b"\xa3\xff\xfe\xfd",  # str with invalid UTF-8
    ],
)
def test_malformed_frames_raise_codec_error(frame):
    with pytest.raises(CodecError):
        decode(frame)


def test_truncated_frames_raise_codec_error():
    frame = encode(message("add", request={"prompt_token_ids": list(range(300)), "id": "x" * 50}))
    for cut in range(1, len(frame), 7):
        with pytest.raises(CodecError):
            decode(frame[:cut])


def test_oversized_frame_is_rejected_before_decoding(monkeypatch):
    calls = []
    monkeypatch.setattr(msgpack, "unpackb", lambda *a, **k: calls.append(1))
    with pytest.raises(CodecError, match="over the 100 limit"):
        decode(b"\x80" * 101, max_frame_bytes=100)
    assert calls == []


def test_encode_refuses_non_maps_unsupported_types_and_oversize():
    with pytest.raises(CodecError):
        encode([1, 2])  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode({"x": object()})
    with pytest.raises(CodecError):
        encode({"x": "y" * 1000}, max_frame_bytes=100)


def test_numpy_values_travel_as_plain_numbers():
    import numpy as np

    msg = decode(
        encode({"ids": np.arange(3, dtype=np.int32), "x": np.float32(0.5), "n": np.int64(7)})
    )
    assert msg == {"ids": [0, 1, 2], "x": 0.5, "n": 7}
    assert type(msg["n"]) is int


def test_message_type_requires_a_string_type():
    with pytest.raises(CodecError):
        message_type({"v": 1})


def test_queues_deliver_maps_and_surface_bad_frames():
    ctx = zmq.Context()
    try:
        pull_sock, push_sock = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        port = pull_sock.bind_to_random_port("tcp://127.0.0.1")
        push_sock.connect(f"tcp://127.0.0.1:{port}")
        pull = PullQueue(pull_sock, MessageCodec(ToEngine, max_frame_bytes=1000))
        push = PushQueue(push_sock, MessageCodec(ToEngine))
        push.put(Abort(request_ids=["a", "b"]))
        push_sock.send(b"\xc1garbage")
        push.put(Shutdown())
        assert pull.poll(2000)
        assert pull.get().request_ids == ["a", "b"]
        assert pull.poll(2000)
        with pytest.raises(CodecError):
            pull.get()
        assert pull.poll(2000)
        assert isinstance(pull.get_nowait(), Shutdown)
        assert pull.get_nowait() is None
    finally:
        ctx.destroy(linger=0)
