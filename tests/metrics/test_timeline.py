"""Request timelines recorded by a real EngineCore (tiny random-weight model on the CPU)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from paternoster.config import TimelineConfig
from paternoster.engine.messages import EngineCoreRequest
from paternoster.entrypoints.engine_args import build_engine_config
from paternoster.metrics.chrome_trace import to_chrome_trace
from paternoster.metrics.gantt import plot_timeline_gantt
from paternoster.metrics.timeline import TimelineRecorder, is_sampled, queue_intervals
from paternoster.sampling_params import SamplingParams
from tests.metrics.timeline_utils import (
    check_chrome_trace,
    make_engine,
    run_requests,
    write_tiny_model,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def _spans(req: dict, kind: str | None = None) -> list[dict]:
    return [e for e in req["events"] if e["kind"] != "preempt" and kind in (None, e["kind"])]


def test_off_by_default(model_dir):
    engine = make_engine(model_dir)
    assert engine.timeline is None
    run_requests(engine, [5], max_tokens=3)
    assert engine.timeline_snapshot() is None


def test_prefill_chunks_sum_to_prompt_and_decode_counts_tokens(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=256), max_num_batched_tokens=16)
    prompt_lens, max_tokens = [5, 23, 40, 9], 6
    got = run_requests(engine, prompt_lens, max_tokens)
    snap = engine.timeline_snapshot()
    assert engine.stats()["num_preemptions_total"] == 0
    reqs = {r["request_id"]: r for r in snap["requests"]}
    assert list(reqs) == [f"r{i}" for i in range(len(prompt_lens))]  # arrival order
    for i, n in enumerate(prompt_lens):
        r = reqs[f"r{i}"]
        prefill = _spans(r, "prefill")
        assert sum(e["tokens"] for e in prefill) == n
        assert all(e["tokens"] <= 16 and e["first_step"] == e["last_step"] for e in prefill)
        assert len(prefill) >= -(-n // 16)  # a 40-token prompt takes >= 3 chunks
        assert [e["sampled"] for e in prefill] == [0] * (len(prefill) - 1) + [1]
        decode = _spans(r, "decode")
        assert sum(e["tokens"] for e in decode) == max_tokens - 1 == got[f"r{i}"] - 1
        assert sum(e["sampled"] for e in _spans(r)) == r["num_output_tokens"] == max_tokens
        assert r["finish_reason"] == "length" and r["num_preemptions"] == 0
        assert r["arrival"] <= r["first_scheduled"] == prefill[0]["start"]
        assert r["finish"] == decode[-1]["end"]
        spans = _spans(r)
        assert all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:]))
    # Steps: the same ones the engine ran, within the token budget, rows add up.
    assert [s["step"] for s in snap["steps"]] == [rec.step for rec in engine.step_log]
    for s, rec in zip(snap["steps"], engine.step_log):
        assert [(rid, n) for rid, n, _ in s["rows"]] == list(rec.scheduled)
        assert s["prefill_tokens"] + s["decode_tokens"] == sum(n for _, n, _ in s["rows"]) <= 16
        assert s["num_requests"] == len(rec.scheduled)


def test_preemption_appears_and_is_followed_by_recompute(model_dir):
    # 10 blocks of 4 slots; three requests of 8 + 12 tokens need 15 blocks.
    engine = make_engine(
        model_dir, TimelineConfig(size=256), scheduler="fcfs", num_kv_blocks=10,
        max_num_batched_tokens=64, max_model_len=64,
    )  # fmt: skip
    run_requests(engine, [8, 8, 8], max_tokens=12)
    snap = engine.timeline_snapshot()
    total = engine.stats()["num_preemptions_total"]
    assert total > 0
    assert sum(r["num_preemptions"] for r in snap["requests"]) == total
    assert sum(s["num_preempted"] for s in snap["steps"]) == total
    for r in snap["requests"]:
        events = r["events"]
        generated = 0
        for k, e in enumerate(events):
            if e["kind"] != "preempt":
                generated += e["sampled"]
                continue
            after = _spans({"events": events[k + 1 :]})
            assert after and after[0]["kind"] == "prefill" and after[0]["recompute"]
            # The recompute covers the prompt and every token generated before it.
            recompute = [e for e in after if e["recompute"]]
            assert sum(e["tokens"] for e in recompute) == 8 + generated
            assert after[0]["start"] >= e["time"]
        assert sum(e["sampled"] for e in _spans(r)) == r["num_output_tokens"] == 12
        # One wait after arrival, one after each preemption.
        assert len(queue_intervals(r, snap["now"])) == 1 + r["num_preemptions"]
    tracks = check_chrome_trace(to_chrome_trace(snap))
    names = {e["name"] for evs in tracks.values() for e in evs}
    assert {"queue", "prefill", "recompute", "decode"} <= names


def test_ring_buffer_and_request_cap_stay_bounded(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=8, max_requests=3))
    seen = []

    def check(eng):
        seen.append((eng.timeline.num_steps, eng.timeline.num_requests))

    run_requests(engine, [5, 9, 3, 12, 7, 4, 6, 10], max_tokens=4, after_step=check)
    assert max(s for s, _ in seen) == 8 and max(r for _, r in seen) <= 3
    snap = engine.timeline_snapshot()
    assert len(snap["steps"]) == 8
    assert snap["num_steps_total"] == engine.stats()["num_steps"]
    assert snap["num_steps_dropped"] == snap["num_steps_total"] - 8
    assert snap["steps"][-1]["step"] == snap["num_steps_total"] - 1
    assert len(snap["requests"]) <= 3
    assert snap["num_requests_evicted"] >= 8 - 3
    check_chrome_trace(to_chrome_trace(snap))


def test_sample_rate_zero_records_no_request():
    recorder = TimelineRecorder(size=4, sample_rate=0.0)
    for i in range(100):
        recorder.on_arrival(SimpleNamespace(request_id=f"req-{i}", num_prompt_tokens=3,
                                            arrival_time=float(i)))  # fmt: skip
    assert recorder.num_requests == 0 and recorder.snapshot()["requests"] == []
    assert not any(is_sampled(f"req-{i}", 0.0) for i in range(1000))


def test_sample_rate_zero_keeps_step_totals_only(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=64, sample_rate=0.0))
    run_requests(engine, [5, 9], max_tokens=3)
    snap = engine.timeline_snapshot()
    assert snap["requests"] == [] and engine.timeline.num_requests == 0
    assert snap["steps"] and all(s["rows"] == [] for s in snap["steps"])
    assert sum(s["prefill_tokens"] for s in snap["steps"]) == 14
    assert sum(s["decode_tokens"] for s in snap["steps"]) == 2 * 2


def test_sampling_is_deterministic_and_proportional():
    ids = [f"cmpl-{i:06d}-0" for i in range(4000)]
    picked = [i for i in ids if is_sampled(i, 0.25)]
    assert picked == [i for i in ids if is_sampled(i, 0.25)]
    assert 0.2 < len(picked) / len(ids) < 0.3
    assert all(is_sampled(i, 1.0) for i in ids[:10])


def test_partial_sampling_records_only_chosen_requests(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=64, sample_rate=0.5))
    run_requests(engine, [3] * 12, max_tokens=2)
    snap = engine.timeline_snapshot()
    recorded = {r["request_id"] for r in snap["requests"]}
    assert recorded == {f"r{i}" for i in range(12) if is_sampled(f"r{i}", 0.5)}
    assert 0 < len(recorded) < 12
    rows = {rid for s in snap["steps"] for rid, _, _ in s["rows"]}
    assert rows == recorded
    assert sum(s["num_requests"] - len(s["rows"]) for s in snap["steps"]) > 0


def test_abort_finishes_the_request_with_reason_abort(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=16))
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine.add_request(EngineCoreRequest("running", [1, 2, 3], params))
    engine.step()
    engine.step()
    engine.add_request(EngineCoreRequest("waiting", [4, 5], params))
    engine.abort_requests(["running", "waiting"])
    snap = engine.timeline_snapshot()
    reqs = {r["request_id"]: r for r in snap["requests"]}
    assert reqs["running"]["finish_reason"] == "abort"
    assert reqs["running"]["finish"] >= _spans(reqs["running"])[-1]["end"]
    assert reqs["waiting"]["first_scheduled"] is None and reqs["waiting"]["events"] == []
    (wait,) = queue_intervals(reqs["waiting"], snap["now"])
    assert wait == (reqs["waiting"]["arrival"], reqs["waiting"]["finish"])
    check_chrome_trace(to_chrome_trace(snap))


def test_snapshot_is_a_copy(model_dir):
    engine = make_engine(model_dir, TimelineConfig(size=16))
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    engine.add_request(EngineCoreRequest("a", [1, 2, 3], params))
    engine.step()
    engine.step()
    before = engine.timeline_snapshot()
    decode = _spans(before["requests"][0], "decode")[0]
    tokens = decode["tokens"]
    engine.step()
    assert decode["tokens"] == tokens
    assert _spans(engine.timeline_snapshot()["requests"][0], "decode")[0]["tokens"] == tokens + 1


def test_chrome_trace_tracks_and_gantt_png(model_dir, tmp_path):
    engine = make_engine(model_dir, TimelineConfig(size=64), max_num_batched_tokens=8)
    run_requests(engine, [5, 17, 11], max_tokens=4)
    snap = engine.timeline_snapshot()
    trace = to_chrome_trace(snap)
    tracks = check_chrome_trace(trace)
    assert len(tracks) == 3
    for tid, req in enumerate(snap["requests"], start=1):
        names = [e["name"] for e in tracks[tid]]
        assert names[0] == "queue"
        assert names.count("prefill") == len(_spans(req, "prefill"))
        tokens = sum(e["args"]["tokens"] for e in tracks[tid] if e["name"] == "prefill")
        assert tokens == req["num_prompt_tokens"]
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    assert len(steps) == len(snap["steps"])
    assert all({"num_requests", "num_tokens", "num_preempted"} <= e["args"].keys() for e in steps)
    assert trace["otherData"]["origin_unix"] > 1.6e9
    for x in ("time", "step"):
        png = tmp_path / f"gantt-{x}.png"
        plot_timeline_gantt(snap, png, x=x)
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    with pytest.raises(ValueError, match="x must be"):
        plot_timeline_gantt(snap, tmp_path / "bad.png", x="tokens")


def test_empty_snapshot_exports(tmp_path):
    snap = TimelineRecorder(size=4).snapshot()
    check_chrome_trace(to_chrome_trace(snap))
    plot_timeline_gantt(snap, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


def test_config_flags_and_validation():
    cfg = build_engine_config("m", timeline_size=128, timeline_sample_rate=0.5)
    assert cfg.timeline == TimelineConfig(size=128, sample_rate=0.5, max_requests=None)
    assert type(cfg).from_dict(cfg.to_dict()).timeline == cfg.timeline
    for bad, field in (({"size": -1}, "size"), ({"sample_rate": 1.5}, "sample_rate"),
                       ({"max_requests": 0}, "max_requests")):  # fmt: skip
        with pytest.raises(ValueError, match=field):
            TimelineConfig(**bad)


def test_offline_llm_exports_its_timeline(default_model_path, tmp_path):
    import shutil

    from paternoster import LLM

    d = write_tiny_model(tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, d / name)
    kw = dict(load_format="dummy", dtype="float32", max_model_len=128, num_kv_blocks=64,
              block_size=4)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    off = LLM(str(d), **kw)
    with pytest.raises(RuntimeError, match="timeline_size"):
        off.timeline()
    llm = LLM(str(d), timeline_size=32, **kw)
    outs = llm.generate([[1, 2, 3], [4, 5, 6, 7, 8]], params)
    paths = {k: tmp_path / f"t.{k}" for k in ("json", "png", "snap")}
    snap = llm.save_timeline(paths["json"], paths["png"], paths["snap"])
    assert [r["num_output_tokens"] for r in snap["requests"]] == [
        len(o.outputs[0].token_ids) for o in outs
    ]
    check_chrome_trace(json.loads(paths["json"].read_text()))
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert json.loads(paths["snap"].read_text())["requests"] == snap["requests"]


class _Outbox:
    """An engine loop's output queue that refuses frames over ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        from paternoster.engine.codec import MessageCodec
        from paternoster.engine.messages import FromEngine

        self.codec = MessageCodec(FromEngine, max_frame_bytes=limit)
        self.sent: list = []

    def put(self, msg) -> None:
        self.codec.encode(msg)
        self.sent.append(msg)


def test_engine_loop_answers_timeline_requests_within_the_frame_limit(model_dir):
    from paternoster.engine.codec import MessageCodec
    from paternoster.engine.messages import FromEngine, TimelineQuery, TimelineReply
    from paternoster.engine.process import EngineLoop

    engine = make_engine(model_dir, TimelineConfig(size=64))
    run_requests(engine, [5, 23, 40, 9], max_tokens=6)
    whole = TimelineReply(id=1, timeline=engine.timeline_snapshot())
    full = len(MessageCodec(FromEngine).encode(whole))
    out = _Outbox(limit=full // 3)
    EngineLoop(engine, None, out, None)._handle(TimelineQuery(id=7))
    (reply,) = out.sent
    snap = reply.timeline
    assert isinstance(reply, TimelineReply) and reply.id == 7 and reply.error is None
    assert 0 < len(snap["steps"]) < engine.timeline.num_steps
    assert snap["num_steps_dropped"] == snap["num_steps_total"] - len(snap["steps"])
    assert snap["steps"][-1]["step"] == engine.stats()["num_steps"] - 1  # the newest kept

    off = _Outbox(limit=1 << 20)
    EngineLoop(make_engine(model_dir), None, off, None)._handle(TimelineQuery(id=8))
    assert off.sent[0].timeline is None and "--timeline-size" in off.sent[0].error
