"""EngineCoreOutput.queue_time on the wire stays backward compatible."""

from paternoster.engine.messages import EngineCoreOutput


def test_queue_time_round_trips():
    out = EngineCoreOutput("r", [1], queue_time=0.25)
    assert EngineCoreOutput.from_wire(out.to_wire()).queue_time == 0.25


def test_queue_time_is_omitted_when_unset_and_unknown_keys_are_ignored():
    wire = EngineCoreOutput("r", [1]).to_wire()
    assert "queue_time" not in wire
    assert EngineCoreOutput.from_wire({**wire, "future_field": 1}).queue_time is None
