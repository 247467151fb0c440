"""EngineCoreOutput.queue_time on the engine link: round trips, is left out
when unset, and an older reader ignores fields it does not know."""

import msgpack

from paternoster.engine.codec import MessageCodec
from paternoster.engine.messages import EngineCoreOutput, FromEngine, Outputs


def test_queue_time_round_trips():
    codec = MessageCodec(FromEngine)
    msg = Outputs(outputs=[EngineCoreOutput("r", [1], queue_time=0.25)])
    (out,) = codec.decode(codec.encode(msg)).outputs
    assert out.queue_time == 0.25 and out.new_token_ids == [1]


def test_queue_time_is_omitted_when_unset_and_unknown_keys_are_ignored():
    codec = MessageCodec(FromEngine)
    raw = msgpack.unpackb(codec.encode(Outputs(outputs=[EngineCoreOutput("r", [1])])))
    (wire,) = raw["outputs"]
    assert "queue_time" not in wire
    raw["outputs"] = [{**wire, "future_field": 1}]
    (out,) = codec.decode(msgpack.packb(raw)).outputs
    assert out.queue_time is None and out.request_id == "r"
