"""bench/slo_cross_fit.py: steps of one policy predict another's capacity
(no server: the 'server' is the simulator on a known cost model)."""

from __future__ import annotations

import json

import pytest

from paternoster.bench.capacity import Objectives, SearchPlan
from paternoster.bench.slo_capacity import LONG_MIX, Policy, sim_capacity, sim_trace
from paternoster.bench.slo_cross_fit import cross_fit, parse_args
from paternoster.scheduling.cost_model import CostModel
from paternoster.simulate import simulate
from paternoster.simulate.gantt import to_timeline

FLAGS = ["--probe-duration", "20", "--probe-requests", "10", "--bisect-rounds", "1"]


def test_fcfs_steps_predict_chunked_prefill_as_the_true_model_does(tmp_path):
    """fcfs's timeline on a known model fits that model back, so the
    chunked_prefill capacity predicted from it is the one the true model gives."""
    true = CostModel(overhead=0.03, a_prefill=4e-4, a_decode=9e-4, a_kv=3e-6, a_kv_prefill=6e-7)
    (tmp_path / "results.json").write_text("{}")  # filled in below
    args = parse_args([str(tmp_path), *FLAGS])
    plan = SearchPlan("rate", args.start, 2.0, args.bisect_rounds, 0.02)
    chunked = Policy("chunked_prefill 256", "chunked_prefill", max_num_batched_tokens=256)
    expected = sim_capacity(chunked, LONG_MIX, plan, Objectives(2.0, 0.2), args, true).capacity
    assert expected is not None
    trace = sim_trace(LONG_MIX, 1.0, 40, 0, args.max_model_len)
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "fcfs.timeline.json").write_text(
        json.dumps(to_timeline(simulate(trace, "fcfs", cost_model=true))))
    measured = {"fcfs": {"real": {"capacity": 2.0}},
                "chunked_prefill 256": {"real": {"capacity": expected * 2}}}
    (tmp_path / "results.json").write_text(
        json.dumps({"mix_specs": {"long": LONG_MIX}, "mixes": {"long": measured}}))
    lines = cross_fit(args, log=lambda *a, **k: None).splitlines()
    assert lines[0] == "| mix | steps fitted from (R², knee) | fcfs | chunked_prefill 256 |"
    fitted = [c.strip() for c in lines[2].strip("|").split("|")]
    assert fitted[0] == "long" and fitted[1].startswith("fcfs (1.000,")
    assert fitted[3] == f"{expected:g} (0.50)"  # out of sample, against twice the truth
    assert lines[3] == f"| long | measured | 2 | {expected * 2:g} |"
    assert len(lines) == 4  # chunked_prefill has no timeline: no row of its own


def test_a_directory_without_a_run_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path)])


def test_a_run_without_timelines_is_an_error(tmp_path):
    (tmp_path / "results.json").write_text(
        json.dumps({"mixes": {"long": {"fcfs": {"real": {"capacity": 2.0}}}}}))
    with pytest.raises(ValueError, match="needs slo_capacity.py --real --fit-timeline"):
        cross_fit(parse_args([str(tmp_path), *FLAGS]), log=lambda *a, **k: None)
