"""Traces (JSONL, synthetic mix) and the ``paternoster simulate`` command line."""

from __future__ import annotations

import json

import pytest

from paternoster.simulate import TraceRequest, load_trace, save_trace, synthetic_mix
from paternoster.simulate.cli import main


def test_mix_is_seeded_and_respects_max_model_len():
    a = synthetic_mix(200, rate=2.0, seed=7, max_model_len=2048)
    assert a == synthetic_mix(200, rate=2.0, seed=7, max_model_len=2048)
    assert a != synthetic_mix(200, rate=2.0, seed=8, max_model_len=2048)
    assert a[0].arrival_time == 0.0
    assert [r.arrival_time for r in a] == sorted(r.arrival_time for r in a)
    assert all(r.prompt_len + r.output_len <= 2048 for r in a)
    assert {r.tag for r in a} == {"chat", "summary", "long_prompt"}
    assert {r.priority for r in a} == {0, 1, 2}


def test_trace_round_trip_and_errors(tmp_path):
    trace = [TraceRequest(0.0, 10, 3), TraceRequest(0.5, 20, 4, priority=2, request_id="x")]
    save_trace(trace, tmp_path / "t.jsonl")
    assert load_trace(tmp_path / "t.jsonl") == trace
    (tmp_path / "bad.jsonl").write_text('{"arrival_time": 0, "prompt_len": 0, "output_len": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: prompt_len"):
        load_trace(tmp_path / "bad.jsonl")
    (tmp_path / "extra.jsonl").write_text('{"arrival_time": 0, "prompt_len": 1, "foo": 1}\n')
    with pytest.raises(ValueError, match="unknown fields"):
        load_trace(tmp_path / "extra.jsonl")


def test_cli_mix_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["--mix", "--num-requests", "6", "--rate", "4", "--max-model-len", "1024",
               "--num-kv-blocks", "256", "--out", str(out)])  # fmt: skip
    assert rc == 0
    data = json.loads((out / "fcfs.json").read_text())
    assert data["summary"]["num_requests"] == 6 and len(data["requests"]) == 6
    assert (out / "fcfs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "trace.jsonl").exists()
    assert "| fcfs |" in capsys.readouterr().out


def test_cli_compare_runs_each_policy_on_the_same_trace(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    save_trace(synthetic_mix(5, rate=3.0, seed=1, max_model_len=512), trace)
    rc = main(["--trace", str(trace), "--compare", "fcfs,chunked_prefill", "--unit-cost",
               "--max-model-len", "512", "--num-kv-blocks", "128", "--no-plot",
               "--scheduler-config", '{"chunked_prefill": {"long_prefill_token_threshold": 64}}',
               "--out", str(tmp_path / "o")])  # fmt: skip
    assert rc == 0
    table = (tmp_path / "o" / "summary.md").read_text()
    assert "| fcfs |" in table and "| chunked_prefill |" in table
    cp = json.loads((tmp_path / "o" / "chunked_prefill.json").read_text())
    assert cp["scheduler_config"] == {"long_prefill_token_threshold": 64}


def test_cli_bad_input_exits_2(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 2
    assert "--trace PATH or --mix" in capsys.readouterr().err
    assert main(["--mix", "--scheduler", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown scheduler" in capsys.readouterr().err


def test_cli_compare_names_the_policy_that_refuses_its_options(tmp_path, capsys):
    rc = main(["--mix", "--num-requests", "4", "--compare", "fcfs,slo", "--unit-cost",
               "--no-plot", "--scheduler-config", '{"slo": {"margin": 5}}',
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    assert "error: policy slo: margin must be" in capsys.readouterr().err
    # Checked before any policy runs: fcfs left nothing behind.
    assert not (tmp_path / "fcfs.json").exists() and not (tmp_path / "trace.jsonl").exists()


def test_cli_shared_settings_are_not_blamed_on_a_policy(tmp_path, capsys):
    rc = main(["--mix", "--num-requests", "4", "--compare", "fcfs,slo", "--unit-cost",
               "--no-plot", "--max-num-seqs", "0", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "max_num_seqs must be >= 1, got 0" in err and "policy" not in err


def test_cli_empty_fit_timeline_is_named(tmp_path, capsys):
    assert main(["--mix", "--fit-timeline", "", "--out", str(tmp_path)]) == 2
    assert "--fit-timeline needs a server URL or a snapshot file" in capsys.readouterr().err


def test_cli_empty_cost_model_is_named_not_ignored(tmp_path, capsys):
    # An empty path used to fall back to the built-in model without a word.
    rc = main(["--mix", "--num-requests", "4", "--no-plot", "--cost-model", " ",
               "--out", str(tmp_path)])  # fmt: skip
    assert rc == 2
    assert "--cost-model needs a JSON file's path, got ' '" in capsys.readouterr().err
    assert not (tmp_path / "trace.jsonl").exists()


def test_cli_unwritable_cost_model_path_is_an_input_error(tmp_path):
    import argparse

    from paternoster.scheduling.cost_model import CostModel
    from paternoster.simulate.cli import _saved

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    args = argparse.Namespace(cost_model=str(blocker / "cost_model.json"))
    with pytest.raises(ValueError, match="cannot write the cost model to .*a_file"):
        _saved("report", CostModel.unit(), args, tmp_path)


def test_cli_out_that_is_a_file_is_an_input_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["--mix", "--unit-cost", "--no-plot", "--out", str(blocker)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--cost-model", "--trace"])
def test_cli_missing_input_file_fails_before_making_the_out_folder(tmp_path, capsys, flag):
    out = tmp_path / "out"
    args = ["--num-requests", "4", "--no-plot", flag, str(tmp_path / "missing.json"),
            "--out", str(out)]  # fmt: skip
    assert main(args if flag == "--trace" else ["--mix", *args]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("bad", [["--num-requests", "0"], ["--rate", "-1"],
                                 ["--max-model-len", "0"], ["--num-kv-blocks", "0"],
                                 ["--block-size", "0"]])
def test_cli_bad_setting_leaves_no_out_folder_behind(tmp_path, capsys, bad):
    out = tmp_path / "out"
    rc = main(["--mix", "--num-requests", "4", "--no-plot", "--unit-cost", *bad,
               "--out", str(out)])  # fmt: skip
    assert rc == 2 and "error:" in capsys.readouterr().err
    assert not out.exists()


def test_cli_input_error_keeps_an_out_folder_that_was_there(tmp_path, capsys):
    (tmp_path / "earlier.json").write_text("{}")
    assert main(["--mix", "--num-requests", "0", "--out", str(tmp_path)]) == 2
    assert (tmp_path / "earlier.json").exists()
