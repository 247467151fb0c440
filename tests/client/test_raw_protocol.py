"""A client written from docs/protocol.md ("Client protocol") alone, with raw
pyzmq and msgpack: this module does not import paternoster.

The fake engine generates each request's prompt tokens in turn, so the
expected output of every request is known exactly; texts are checked against
the Hugging Face tokenizer's own decode.
"""

from __future__ import annotations

import msgpack
import pytest
import zmq

from tests.client.conftest import zmq_server

TIMEOUT_MS = 10_000


class Raw:
    """A DEALER speaking the protocol by hand."""

    def __init__(self, address: str, hello: bool = True, **hello_fields):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        if hello:
            self.send({"type": "hello", **hello_fields})
            welcome = self.recv()
            assert welcome["type"] == "welcome", welcome
            self.welcome = welcome

    def send(self, msg: dict) -> None:
        self.sock.send(msgpack.packb({"v": 1, **msg}, use_bin_type=True))

    def send_raw(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout_ms: int = TIMEOUT_MS) -> dict:
        assert self.sock.poll(timeout_ms), "no message from the server"
        return msgpack.unpackb(self.sock.recv(), raw=False)

    def run(self, rid: str) -> tuple[list[dict], dict]:
        """All messages of request ``rid`` up to its final (others must not come)."""
        deltas = []
        while True:
            m = self.recv()
            assert m.get("id") == rid, m
            if m["type"] in ("final", "error"):
                return deltas, m
            assert m["type"] == "delta", m
            deltas.append(m)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture()
def raw(server):
    c = Raw(server.address)
    yield c
    c.close()


def _expected(prompt: list[int], n: int) -> list[int]:
    return [prompt[i % len(prompt)] for i in range(n)]


def test_welcome_describes_the_server(raw):
    w = raw.welcome
    assert w["v"] == 1 and w["server"] == "paternoster"
    assert w["max_model_len"] == 256
    assert w["max_message_bytes"] > 0 and w["max_in_flight"] > 0
    assert w["max_request_id_bytes"] == 256


def test_generate_without_stream_sends_one_final_with_everything(raw, tokenizer):
    prompt = [400, 500, 600]
    raw.send({"type": "generate", "id": "a", "prompt_token_ids": prompt, "stream": False,
              "sampling": {"max_tokens": 7}})  # fmt: skip
    deltas, final = raw.run("a")
    assert deltas == []
    assert final["type"] == "final"
    assert final["token_ids"] == _expected(prompt, 7)
    assert final["text"] == tokenizer.decode(_expected(prompt, 7))
    assert final["finish_reason"] == "length"
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_stream_pieces_join_to_the_whole_output(raw, tokenizer):
    prompt = tokenizer("The lift never stops").input_ids
    raw.send({"type": "generate", "id": "s", "prompt": "The lift never stops",
              "sampling": {"max_tokens": 9}})  # fmt: skip
    deltas, final = raw.run("s")
    assert len(deltas) >= 5  # one token per step
    ids = [t for m in deltas + [final] for t in m["token_ids"]]
    text = "".join(m["text"] for m in deltas + [final])
    assert ids == _expected(prompt, 9)
    assert text == tokenizer.decode(ids)
    assert final["finish_reason"] == "length" and final["usage"]["completion_tokens"] == 9


def test_stop_string_ends_the_request_with_its_reason(raw, tokenizer):
    prompt = tokenizer(" alpha beta gamma", add_special_tokens=False).input_ids
    raw.send({"type": "generate", "id": "st", "prompt_token_ids": prompt,
              "sampling": {"max_tokens": 30, "stop": ["gamma"]}})  # fmt: skip
    deltas, final = raw.run("st")
    text = "".join(m["text"] for m in deltas + [final])
    assert final["finish_reason"] == "stop" and final["stop_reason"] == "gamma"
    assert text == " alpha beta "


def test_abort_mid_stream_gets_a_final_with_reason_abort(server):
    c = Raw(server.address)
    try:
        c.send({"type": "generate", "id": "long", "prompt_token_ids": [300],
                "sampling": {"max_tokens": 200}})  # fmt: skip
        first = c.recv()
        assert first["type"] == "delta" and first["id"] == "long"
        c.send({"type": "abort", "id": "long"})
        _, final = c.run("long")
        assert final["type"] == "final" and final["finish_reason"] == "abort"
        assert final["usage"]["completion_tokens"] < 200
        c.send({"type": "abort", "id": "long"})  # finished: ignored, no reply
        c.send({"type": "abort", "id": "never-sent"})
        c.send({"type": "health", "id": "h"})
        assert c.recv() == {"v": 1, "type": "health", "id": "h", "status": "ok"}
    finally:
        c.close()
    stats = server.http.wait_for(lambda s: s["num_in_flight"] == 0, what="abort done")
    assert stats["engine"]["num_running"] == 0


def test_models_and_health_echo_the_id(raw):
    raw.send({"type": "models", "id": "m1"})
    m = raw.recv()
    assert m["type"] == "models" and m["id"] == "m1"
    assert [d["id"] for d in m["data"]] and m["data"][0]["max_model_len"] == 256
    raw.send({"type": "health"})
    assert raw.recv()["status"] == "ok"


def test_messages_before_hello_are_refused(server):
    c = Raw(server.address, hello=False)
    try:
        c.send({"type": "generate", "id": "x", "prompt": "hi"})
        e = c.recv()
        assert (e["type"], e["code"], e["id"]) == ("error", "handshake_required", "x")
    finally:
        c.close()


def test_unsupported_version_is_refused_with_the_spoken_ones(server):
    c = Raw(server.address, hello=False)
    try:
        c.sock.send(msgpack.packb({"v": 99, "type": "hello"}))
        e = c.recv()
        assert e["code"] == "unsupported_version" and "[1]" in e["message"]
        c.sock.send(msgpack.packb({"type": "hello"}))  # no version at all
        assert c.recv()["code"] == "unsupported_version"
    finally:
        c.close()


BAD_GENERATES = [
    ({"prompt": "hi"}, "bad_request", "id"),  # no id
    ({"id": 7, "prompt": "hi"}, "bad_request", "id"),
    ({"id": "", "prompt": "hi"}, "bad_request", "id"),
    ({"id": "x" * 257, "prompt": "hi"}, "bad_request", "id"),
    ({"id": "r"}, "bad_request", "prompt"),  # neither prompt
    ({"id": "r", "prompt": "a", "prompt_token_ids": [1]}, "bad_request", "prompt"),
    ({"id": "r", "prompt": ""}, "bad_request", "prompt"),
    ({"id": "r", "prompt_token_ids": []}, "bad_request", "prompt_token_ids"),
    ({"id": "r", "prompt_token_ids": [10**9]}, "bad_request", "prompt_token_ids"),
    ({"id": "r", "prompt_token_ids": ["1"]}, "bad_request", "prompt_token_ids"),
    ({"id": "r", "prompt": "a", "sampling": {"temperature": "hot"}}, "bad_request",
     "sampling.temperature"),
    ({"id": "r", "prompt": "a", "sampling": {"temperature": -1.0}}, "bad_request",
     "sampling.temperature"),
    ({"id": "r", "prompt": "a", "sampling": {"temperature": float("nan")}}, "bad_request",
     "sampling.temperature"),
    ({"id": "r", "prompt": "a", "sampling": {"top_p": 0.0}}, "bad_request", "sampling.top_p"),
    ({"id": "r", "prompt": "a", "sampling": {"top_k": -2}}, "bad_request", "sampling.top_k"),
    ({"id": "r", "prompt": "a", "sampling": {"max_tokens": 0}}, "bad_request",
     "sampling.max_tokens"),
    ({"id": "r", "prompt": "a", "sampling": {"max_tokens": 1.5}}, "bad_request",
     "sampling.max_tokens"),
    ({"id": "r", "prompt": "a", "sampling": {"max_tokens": True}}, "bad_request",
     "sampling.max_tokens"),
    ({"id": "r", "prompt": "a", "sampling": {"max_tokens": 10_000}}, "bad_request",
     "sampling.max_tokens"),
    ({"id": "r", "prompt": "a", "sampling": {"logprobs": 21}}, "bad_request",
     "sampling.logprobs"),
    ({"id": "r", "prompt": "a", "sampling": {"stop": ["x"] * 65}}, "bad_request",
     "sampling.stop"),
    ({"id": "r", "prompt": "a", "sampling": {"n": 2}}, "bad_request", "sampling.n"),
    ({"id": "r", "prompt": "a", "sampling": {"temprature": 0.5}}, "bad_request",
     "sampling.temprature"),
    ({"id": "r", "prompt": "a", "sampling": "greedy"}, "bad_request", "sampling"),
    ({"id": "r", "prompt": "a", "stream": "yes"}, "bad_request", "stream"),
    ({"id": "r", "prompt": "a", "priority": 2**63}, "bad_request", "priority"),
    ({"id": "r", "prompt": "a", "colour": "red"}, "bad_request", "colour"),
]


@pytest.mark.parametrize(("fields", "code", "param"), BAD_GENERATES)
def test_bad_generate_gets_an_error_naming_the_field(raw, fields, code, param):
    raw.send({"type": "generate", **fields})
    e = raw.recv()
    assert (e["type"], e["code"], e.get("param")) == ("error", code, param), e
    assert e["message"]
    rid = fields.get("id")
    if isinstance(rid, str) and 0 < len(rid) <= 256:
        assert e["id"] == rid  # the error is that request's final
    raw.send({"type": "health", "id": "after"})  # the connection still works
    assert raw.recv()["status"] == "ok"


def test_prompt_over_the_context_names_both_lengths(raw):
    raw.send({"type": "generate", "id": "big", "prompt_token_ids": [5] * 300})
    e = raw.recv()
    assert e["code"] == "bad_request" and "256" in e["message"] and "300" in e["message"]


def test_duplicate_id_in_flight_is_refused_and_the_first_goes_on(raw):
    raw.send({"type": "generate", "id": "d", "prompt_token_ids": [9], "stream": False,
              "sampling": {"max_tokens": 40}})  # fmt: skip
    raw.send({"type": "generate", "id": "d", "prompt_token_ids": [9]})
    e = raw.recv()
    assert (e["type"], e["code"], e["id"]) == ("error", "duplicate_id", "d")
    _, final = raw.run("d")
    assert final["type"] == "final" and len(final["token_ids"]) == 40


GARBAGE = [
    b"\xc1\xc1\xc1",  # never-used msgpack byte
    msgpack.packb({"v": 1, "type": "generate", "id": "t", "prompt": "hello"})[:-3],  # truncated
    msgpack.packb({"v": 1, "type": "health"}) + b"\x00",  # trailing bytes
    msgpack.packb([1, 2, 3]),  # not a map
    msgpack.packb({1: "a"}),  # non-string keys
    msgpack.packb({"v": 1, "type": "health", "x": msgpack.ExtType(5, b"zz")}),  # ext type
    b"\x81\xa1v\xc4\x01\xff",  # {"v": bytes}... then invalid
    b"",  # empty frame
]


@pytest.mark.parametrize("frame", GARBAGE)
def test_garbage_frames_get_malformed_message(raw, frame):
    raw.send_raw(frame)
    e = raw.recv()
    assert e["type"] == "error" and e["code"] in ("malformed_message", "unsupported_version")
    raw.send({"type": "health"})
    assert raw.recv()["status"] == "ok"


def test_unknown_type_and_missing_type(raw):
    raw.send({"type": "teleport"})
    assert raw.recv()["code"] == "unknown_type"
    raw.send({"id": "z"})
    assert raw.recv()["code"] == "malformed_message"


def test_wrong_frame_count_and_req_envelope(raw):
    raw.send_raw(b"a", b"b", b"c")
    assert raw.recv()["code"] == "malformed_message"
    # an empty delimiter before the body (REQ-style) is accepted and mirrored
    raw.send_raw(b"", msgpack.packb({"v": 1, "type": "health", "id": "env"}))
    assert raw.sock.poll(TIMEOUT_MS)
    frames = raw.sock.recv_multipart()
    assert frames[0] == b"" and msgpack.unpackb(frames[1])["id"] == "env"


def test_bad_input_on_one_connection_never_disturbs_another(server, tokenizer):
    good, bad = Raw(server.address), Raw(server.address)
    try:
        prompt = [111, 222]
        good.send({"type": "generate", "id": "g", "prompt_token_ids": prompt,
                   "sampling": {"max_tokens": 60}})  # fmt: skip
        for frame in GARBAGE + [b"\x00" * 100_000]:
            bad.send_raw(frame)
            assert bad.recv()["type"] == "error"
        deltas, final = good.run("g")
        ids = [t for m in deltas + [final] for t in m["token_ids"]]
        assert ids == _expected(prompt, 60) and final["finish_reason"] == "length"
    finally:
        good.close()
        bad.close()


def test_oversized_frame_is_refused_unread(fake_model_dir):
    with zmq_server(fake_model_dir, {}, "--max-request-body-bytes", "4096") as srv:
        c = Raw(srv.address)
        try:
            assert c.welcome["max_message_bytes"] == 4096
            c.send({"type": "generate", "id": "h", "prompt": "x" * 5000})
            e = c.recv()
            assert e["code"] == "message_too_large" and "4096" in e["message"]
            c.send({"type": "generate", "id": "ok", "prompt_token_ids": [1, 2],
                    "sampling": {"max_tokens": 2}, "stream": False})  # fmt: skip
            assert c.run("ok")[1]["token_ids"] == [1, 2]
        finally:
            c.close()


def test_api_key_is_checked_in_the_handshake(fake_model_dir):
    with zmq_server(fake_model_dir, {}, "--api-key", "sesame") as srv:
        c = Raw(srv.address, hello=False)
        try:
            c.send({"type": "hello"})
            assert c.recv()["code"] == "unauthorized"
            c.send({"type": "hello", "api_key": "wrong"})
            assert c.recv()["code"] == "unauthorized"
            c.send({"type": "health"})
            assert c.recv()["code"] == "handshake_required"
            c.send({"type": "hello", "api_key": "sesame"})
            assert c.recv()["type"] == "welcome"
        finally:
            c.close()
