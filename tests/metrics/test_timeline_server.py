"""GET /debug/timeline and ``paternoster trace`` end to end: a real engine process over
a tiny random-weight model, and the scripted fake engine (which keeps no timeline)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from paternoster.entrypoints.cli import main as cli_main
from tests.entrypoints.utils import FAKE_ENGINE, start_server
from tests.metrics.timeline_utils import check_chrome_trace, write_tiny_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 33)), [40, 41, 42]]
MAX_TOKENS = 5


def _model_dir(default_model_path, folder):
    """The tiny random-weight model plus the default model's tokenizer (prompts are
    token ids below the tiny vocabulary, so the tokenizer only detokenizes)."""
    write_tiny_model(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_path / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def timeline_server(default_model_path, tmp_path_factory):
    d = _model_dir(default_model_path, tmp_path_factory.mktemp("tiny-timeline"))
    with start_server(
        str(d), "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "128",
        "--block-size", "4", "--num-kv-blocks", "64", "--scheduler", "chunked_prefill",
        "--max-num-batched-tokens", "16", "--timeline-size", "256",
    ) as srv:  # fmt: skip
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            bodies = [
                {"prompt": p, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
                for p in PROMPTS
            ]
            for r in pool.map(lambda b: httpx.post(srv.url + "/v1/completions", json=b,
                                                   timeout=60), bodies):  # fmt: skip
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
        yield srv


def test_endpoint_serves_a_chrome_trace(timeline_server):
    r = timeline_server.get("/debug/timeline")
    assert r.status_code == 200
    trace = r.json()
    tracks = check_chrome_trace(trace)
    assert len(tracks) == len(PROMPTS)
    prefill = sorted(
        sum(e["args"]["tokens"] for e in evs if e["name"] in ("prefill", "recompute"))
        for evs in tracks.values()
    )
    assert prefill == sorted(len(p) for p in PROMPTS)
    finishes = [e for e in trace["traceEvents"] if e["name"] == "finish"]
    assert [e["args"]["finish_reason"] for e in finishes] == ["length"] * len(PROMPTS)
    assert all(e["args"]["num_output_tokens"] == MAX_TOKENS for e in finishes)


def test_endpoint_serves_the_raw_snapshot_and_refuses_other_formats(timeline_server):
    snap = timeline_server.get("/debug/timeline?format=snapshot").json()
    assert snap["version"] == 1 and snap["size"] == 256
    assert len(snap["requests"]) == len(PROMPTS)
    for req in snap["requests"]:
        decode = [e for e in req["events"] if e["kind"] == "decode"]
        assert sum(e["tokens"] for e in decode) == MAX_TOKENS - 1
    bad = timeline_server.get("/debug/timeline?format=svg")
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "format"


def test_trace_command_writes_trace_gantt_and_snapshot(timeline_server, tmp_path, capsys):
    out, png, raw = tmp_path / "trace.json", tmp_path / "trace.png", tmp_path / "snap.json"
    rc = cli_main(["trace", "--url", timeline_server.url + "/v1", "-o", str(out),
                   "--gantt", str(png), "--save-snapshot", str(raw)])  # fmt: skip
    assert rc == 0
    assert f"{len(PROMPTS)} requests" in capsys.readouterr().out
    check_chrome_trace(json.loads(out.read_text()))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # A saved snapshot converts offline to the same trace.
    again = tmp_path / "again.json"
    assert cli_main(["trace", "--input", str(raw), "-o", str(again)]) == 0
    assert json.loads(again.read_text()) == json.loads(out.read_text())


def test_without_timelines_the_endpoint_is_404_and_the_command_fails(
    default_model_path, tmp_path, capsys
):
    d = tmp_path / "fake"
    d.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(default_model_path / name, d / name)
    with start_server(str(d), "--engine-cls", FAKE_ENGINE, "--max-model-len", "128") as srv:
        r = srv.get("/debug/timeline")
        assert r.status_code == 404
        err = r.json()["error"]
        assert err["type"] == "NotFoundError" and "--timeline-size" in err["message"]
        rc = cli_main(["trace", "--url", srv.url, "-o", str(tmp_path / "t.json")])
    assert rc == 1
    assert "--timeline-size" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_trace_command_reports_an_unreachable_server(tmp_path, capsys):
    from tests.entrypoints.utils import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert cli_main(["trace", "--url", url, "-o", str(tmp_path / "t.json"), "--timeout", "2"]) == 1
    assert "cannot reach" in capsys.readouterr().err
