"""Workloads: arrival processes, the mix, random lengths, JSONL traces (no network)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from paternoster.bench.workload import (
    DEFAULT_MIX,
    PromptMaker,
    arrival_offsets,
    fit_context,
    load_jsonl,
    make_mix,
    make_random,
    parse_mix,
    with_shared_prefix,
)

N = 20_000


def _gaps(rate, burstiness, seed=0):
    t = arrival_offsets(N, rate, burstiness, seed)
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    return np.diff(t)


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    g = _gaps(5.0, 1.0)
    # The mean of 20k exponential gaps is within ~2.2 % (3 sigma) of 1/rate.
    assert g.mean() == pytest.approx(1 / 5.0, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_keep_the_rate_and_scale_the_cv(burstiness):
    g = _gaps(5.0, burstiness)
    assert g.mean() == pytest.approx(1 / 5.0, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_burstier_arrivals_have_a_larger_cv():
    cv = {b: (g := _gaps(2.0, b)).std() / g.mean() for b in (0.3, 1.0, 3.0)}
    assert cv[0.3] > 1.5 * cv[1.0] > 1.5 * cv[3.0]


def test_arrivals_are_seeded_and_infinite_rate_sends_at_once():
    assert np.array_equal(arrival_offsets(50, 3.0, seed=1), arrival_offsets(50, 3.0, seed=1))
    assert not np.array_equal(arrival_offsets(50, 3.0, seed=1), arrival_offsets(50, 3.0, seed=2))
    assert np.array_equal(arrival_offsets(5, math.inf), np.zeros(5))
    with pytest.raises(ValueError, match="rate"):
        arrival_offsets(5, 0.0)
    with pytest.raises(ValueError, match="burstiness"):
        arrival_offsets(5, 1.0, burstiness=0)


def test_prompt_maker_counts_words_without_a_tokenizer():
    m = PromptMaker(seed=3)
    for n in (1, 17, 500):
        assert len(m.make(n).split()) == n
    assert PromptMaker(seed=3).make(40) == PromptMaker(seed=3).make(40)
    with pytest.raises(ValueError):
        m.make(0)


def test_mix_draws_every_class_within_its_ranges():
    reqs = make_mix(400, PromptMaker(seed=0), DEFAULT_MIX, seed=0)
    classes = {c.tag: c for c in DEFAULT_MIX}
    assert {r.tag for r in reqs} == set(classes)
    for r in reqs:
        c = classes[r.tag]
        assert c.prompt_len[0] <= r.prompt_len <= c.prompt_len[1]
        assert c.output_len[0] <= r.output_len <= c.output_len[1]
        assert len(r.prompt.split()) == r.prompt_len
    shares = {t: sum(r.tag == t for r in reqs) / 400 for t in classes}
    assert shares["short"] == pytest.approx(0.6, abs=0.08)
    # A longer workload starts with the shorter one (capacity probes rely on it).
    assert make_mix(10, PromptMaker(seed=0), seed=0) == reqs[:10]


def test_mix_and_random_fit_the_context():
    for r in make_mix(200, PromptMaker(), DEFAULT_MIX, max_model_len=512):
        assert r.prompt_len + r.output_len <= 512
    reqs = make_random(300, PromptMaker(), 100, 20, range_ratio=0.5, max_model_len=110)
    assert all(r.prompt_len + r.output_len <= 110 for r in reqs)
    assert min(r.output_len for r in reqs) >= 10 and max(r.output_len for r in reqs) <= 30
    assert fit_context(1000, 100, 256) == (156, 100)
    assert fit_context(10, 1000, 256) == (10, 128)
    assert fit_context(10, 10, None) == (10, 10)


def test_random_lengths_are_exact_without_range():
    reqs = make_random(20, PromptMaker(), 64, 8)
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(64, 8)}


def test_parse_mix():
    (a, b) = parse_mix("short=0.7:16-256:8-64, summary=0.3:512-1024:64-128")
    assert (a.tag, a.share, a.prompt_len, a.output_len) == ("short", 0.7, (16, 256), (8, 64))
    assert b.output_len == (64, 128)
    for bad in ("short", "s=1:10-5:1-2", "s=0:1-2:1-2", "s=1:1-2", ""):
        with pytest.raises(ValueError):
            parse_mix(bad)


def test_jsonl_reads_prompts_lengths_and_simulator_traces(tmp_path):
    p = tmp_path / "w.jsonl"
    lines = [
        {"prompt": "hello there world", "output_len": 5, "tag": "chat"},
        {"arrival_time": 0.5, "prompt_len": 12, "output_len": 3, "priority": 1,
         "request_id": "r1"},
        {"prompt_len": 7},
    ]  # fmt: skip
    p.write_text("# comment\n\n" + "".join(json.dumps(x) + "\n" for x in lines))
    reqs = load_jsonl(p, PromptMaker(), default_output_len=9)
    assert [(r.prompt_len, r.output_len, r.tag) for r in reqs] == [
        (3, 5, "chat"), (12, 3, None), (7, 9, None),
    ]  # fmt: skip
    assert reqs[0].prompt == "hello there world"
    assert reqs[1].arrival_time == 0.5 and reqs[0].arrival_time is None
    assert len(load_jsonl(p, PromptMaker(), limit=2)) == 2


@pytest.mark.parametrize(
    ("line", "match"),
    [('{"prompt_len": 0}', "prompt"), ('{"foo": 1}', "unknown"), ("[1]", "object"),
     ('{"prompt_len": 3, "output_len": -1}', "output_len"), ("{", ":1:")],
)  # fmt: skip
def test_jsonl_errors_name_the_line(tmp_path, line, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(ValueError, match=match):
        load_jsonl(p, PromptMaker())


def test_shared_prefix_is_the_same_words_before_every_prompt():
    maker = PromptMaker(seed=3)
    reqs = make_random(5, maker, input_len=12, output_len=4, seed=3)
    prefix = PromptMaker(seed=99).make(40)
    out = with_shared_prefix(reqs, prefix, 40)
    for before, after in zip(reqs, out):
        assert after.prompt == prefix + " " + before.prompt
        assert after.prompt_len == before.prompt_len + 40
        assert len(after.prompt.split()) == after.prompt_len
        assert after.output_len == before.output_len
    assert len({r.prompt for r in out}) == len(out)
    with pytest.raises(ValueError, match="prefix_len"):
        with_shared_prefix(reqs, prefix, 0)
