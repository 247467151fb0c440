"""Fitting the cost model to a server timeline (paternoster.simulate.timeline_fit).

The reference is the simulator: it times every step with a known cost model,
and its timeline (simulate.gantt.to_timeline, built from the scheduler's own
rows) must give that model back.
"""

from __future__ import annotations

import dataclasses

import pytest

from paternoster.scheduling.cost_model import CostModel, StepWork
from paternoster.simulate import simulate, synthetic_mix
from paternoster.simulate.gantt import to_timeline
from paternoster.simulate.timeline_fit import fit_timeline, works_from_timeline

TRUE = CostModel(overhead=0.02, a_prefill=3e-4, a_decode=7e-4, a_kv=3e-6, a_kv_prefill=6e-7)


def _snapshot(scheduler="chunked_prefill", **kw):
    trace = synthetic_mix(40, rate=2.0, seed=5, max_model_len=2048)
    res = simulate(trace, scheduler, cost_model=TRUE, max_num_batched_tokens=256,
                   max_model_len=2048, **kw)
    return res, to_timeline(res)


def test_the_simulators_steps_are_rebuilt_exactly_and_its_model_recovered():
    res, snap = _snapshot()
    works, seconds, skipped, gaps = works_from_timeline(snap)
    assert skipped == 0 and len(works) == len(res.steps)
    for step, work, t in zip(res.steps, works, seconds):
        assert (work.prefill_tokens, work.decode_tokens) == (step.prefill_tokens,
                                                             step.decode_tokens)
        assert work.kv_tokens == step.kv_tokens
        assert t == pytest.approx(step.end - step.start)
    fit = fit_timeline(snap)
    for name in ("overhead", "a_prefill", "a_decode", "a_kv", "a_kv_prefill"):
        assert getattr(fit.cost_model, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0) and fit.cost_model.step_noise < 1e-6
    assert fit.max_prefill_tokens == max(step.prefill_tokens for step in res.steps) == 256
    assert "fitted to" in fit.report() and "warning" not in fit.report()


def test_steps_that_cannot_pin_the_prefill_cost_are_flagged():
    # Short prompts only (<= 16 tokens a step): the report must not present
    # the fit as good for the mix's 1000-token prompts.
    trace = [dataclasses.replace(r, prompt_len=min(r.prompt_len, 16))
             for r in synthetic_mix(40, rate=2.0, seed=5, max_model_len=2048)]
    res = simulate(trace, "fcfs", cost_model=TRUE, max_num_batched_tokens=256,
                   max_model_len=2048, max_num_seqs=1)
    fit = fit_timeline(to_timeline(res))
    assert fit.max_prefill_tokens <= 16
    assert "warning: no step had more than" in fit.report()


def test_a_prefix_cache_hit_and_the_loop_gap_are_accounted_for():
    # Request "a": 48-token prompt of which 32 came from the prefix cache (one
    # 16-token prefill chunk), then three decode steps; the engine loop took
    # 1 ms between steps that continue a request (steps start 51 ms apart, last 50).
    def step(i, rows, pre, dec):
        return {"step": i, "start": 0.051 * i, "end": 0.051 * i + 0.05, "num_requests": len(rows),
                "prefill_tokens": pre, "decode_tokens": dec, "num_preempted": 0, "rows": rows}

    steps = [step(0, [["a", 16, "prefill"]], 16, 0)]
    steps += [step(i, [["a", 1, "decode"]], 0, 1) for i in (1, 2, 3)]
    events = [{"kind": "prefill", "start": 0, "end": 0.05, "first_step": 0, "last_step": 0,
               "tokens": 16, "sampled": 1, "recompute": False},
              {"kind": "decode", "start": 0.051, "end": 0.203, "first_step": 1, "last_step": 3,
               "tokens": 3, "sampled": 3, "recompute": False}]
    snap = {"version": 1, "steps": steps, "requests": [
        {"request_id": "a", "num_prompt_tokens": 48, "num_preemptions": 0,
         "num_events_dropped": 0, "events": events}]}
    works, seconds, skipped, gaps = works_from_timeline(snap)
    assert skipped == 0
    # 32 cached + 16 new: each new token attends the 32 cached and those before it
    assert works[0] == StepWork(16, 0, 0, 16 * 32 + 16 * 17 // 2, 1)
    assert [w.decode_kv_tokens for w in works[1:]] == [49, 50, 51]
    assert seconds[:3] == pytest.approx([0.051] * 3) and seconds[3] == pytest.approx(0.05)
    assert gaps == pytest.approx([0.001] * 3)


def test_steps_that_cannot_be_rebuilt_are_left_out():
    trace = synthetic_mix(12, rate=2.0, seed=3, max_model_len=512)
    res = simulate(trace, "chunked_prefill", cost_model=TRUE, num_kv_blocks=48, block_size=16,
                   max_num_seqs=8, max_num_batched_tokens=128, max_model_len=512)
    snap = to_timeline(res)
    assert res.num_preemptions_total > 0
    works, _, skipped, _ = works_from_timeline(snap)
    preempted = {r["request_id"] for r in snap["requests"] if r["num_preemptions"]}
    bad = [s for s in snap["steps"]
           if s["num_preempted"] or preempted & {row[0] for row in s["rows"]}]
    assert skipped == len(bad) > 0 and len(works) == len(snap["steps"]) - len(bad)
    # an evicted request's rows (not in "requests") leave their steps out too
    snap["requests"] = snap["requests"][1:]
    assert works_from_timeline(snap)[2] > skipped


def test_a_chrome_trace_or_too_few_steps_is_refused():
    with pytest.raises(ValueError, match="format=snapshot"):
        works_from_timeline({"traceEvents": []})
    with pytest.raises(ValueError, match="version"):
        works_from_timeline({"version": 2, "steps": [], "requests": []})
    with pytest.raises(ValueError, match="only 0 usable steps"):
        fit_timeline({"version": 1, "steps": [], "requests": []})


def test_a_real_engines_timeline_gives_the_work_its_step_log_implies(tmp_path):
    """The engine's recorder (not the simulator's) against the engine's own step
    log: each row's context is what that request computed in earlier steps."""
    import numpy as np
    import torch

    from paternoster.config import TimelineConfig
    from tests.metrics.timeline_utils import make_engine, run_requests, write_tiny_model

    torch.set_num_threads(1)
    engine = make_engine(write_tiny_model(tmp_path / "tiny"), TimelineConfig(size=256))
    prompt_lens = [5, 23, 40, 9]
    run_requests(engine, prompt_lens, max_tokens=6)
    works, seconds, skipped, _ = works_from_timeline(engine.timeline_snapshot())
    assert skipped == 0 and len(works) == len(engine.step_log)
    done: dict[str, int] = {}
    for rec, work in zip(engine.step_log, works):
        c = [done.get(rid, 0) for rid in rec.request_ids]
        p = [prompt_lens[int(rid[1:])] for rid in rec.request_ids]
        assert work == StepWork.from_arrays(np.array(c), np.array(rec.num_scheduled_tokens),
                                            np.array(p))
        for rid, n in zip(rec.request_ids, rec.num_scheduled_tokens):
            done[rid] = done.get(rid, 0) + n
    assert all(t > 0 for t in seconds)


def test_the_cli_fits_a_saved_snapshot_and_saves_the_model(tmp_path, capsys):
    import json

    from paternoster.simulate.cli import main

    _, snap = _snapshot()
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(snap))
    assert main(["--fit-timeline", str(path), "--out", str(tmp_path / "out")]) == 0
    got = CostModel.load(tmp_path / "out" / "cost_model.json")
    assert got.a_decode == pytest.approx(TRUE.a_decode, rel=1e-6)
    assert "fitted to" in capsys.readouterr().out
    assert main(["--fit-timeline", str(tmp_path / "none.json"), "--out", str(tmp_path)]) == 2
    assert "cannot read a timeline snapshot" in capsys.readouterr().err


@pytest.mark.parametrize("snap", [
    {"version": 1, "steps": [{}], "requests": []},
    {"version": 1, "steps": [{"step": 1}], "requests": [{"x": 1}]},
    {"version": 1, "steps": "abc", "requests": "def"},
])
def test_a_malformed_snapshot_is_a_value_error(snap):
    with pytest.raises(ValueError, match="not a timeline snapshot"):
        works_from_timeline(snap)


def test_a_step_that_lasts_nan_seconds_is_refused():
    _, snap = _snapshot()
    snap["steps"][3]["end"] = float("nan")
    with pytest.raises(ValueError, match="lasts nan s"):
        fit_timeline(snap)


def test_a_full_timeline_url_names_its_engine():
    from paternoster.simulate.timeline_fit import _base_and_engine

    assert _base_and_engine("http://h:1") == ("http://h:1", 0)
    assert _base_and_engine("http://h:1/debug/timeline?format=snapshot&engine=1") == \
        ("http://h:1", 1)
    with pytest.raises(ValueError, match="engine"):
        _base_and_engine("http://h:1/debug/timeline?engine=x")
