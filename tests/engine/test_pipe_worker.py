"""The frame helpers the worker processes share: a frame split anywhere
across reads comes out whole, in order; an exit code reads as words."""

from __future__ import annotations

import io

from paternoster.engine.pipe_worker import FrameBuffer, describe_exit, encode_frame, read_frame


def test_frames_split_across_reads_come_out_whole_and_in_order():
    frames = [("call", (1, "run", [[1, 2, 3]] * 50)), ("cancel", 1), ("stop", None)]
    data = b"".join(encode_frame(k, p) for k, p in frames)
    for chunk in (1, 7, len(data)):
        buf, got = FrameBuffer(), []
        for i in range(0, len(data), chunk):
            got += buf.feed(data[i:i + chunk])
        assert got == frames
    stream = io.BytesIO(data)
    assert [read_frame(stream) for _ in frames] == frames
    assert read_frame(stream) is None  # end of file: the writer is gone


def test_exit_codes_read_as_words():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(1) == "exited with code 1"
