"""``paternoster bench serve`` against ``paternoster serve`` over the scripted
fake engine (the real tokenizer and HTTP server, no model)."""

from __future__ import annotations

import json
import shutil

import pytest

from paternoster.bench.cli import main as bench_main
from tests.entrypoints.utils import FAKE_ENGINE, start_server
from tests.metrics.utils import delta, scrape


@pytest.fixture(scope="module")
def fake_server(default_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("fake_model_bench")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_model_path / name).exists():
            shutil.copy(default_model_path / name, d / name)
    (d / "fake_engine.json").write_text(json.dumps({"step_delay": 0.01}))
    with start_server(
        str(d), "--engine-cls", FAKE_ENGINE, "--max-model-len", "256", "--num-kv-blocks", "64"
    ) as srv:
        yield srv, d


def _bench(tmp_path, url, *args):
    out = tmp_path / "r.json"
    rc = bench_main(["serve", "--base-url", url, "--no-progress", "--json", str(out), *args])
    return rc, json.loads(out.read_text())


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_output_tokens_match_the_servers_usage_and_metrics(fake_server, tmp_path, api):
    srv, model_dir = fake_server
    before = scrape(srv.url)
    png = tmp_path / "cdf.png"
    rc, data = _bench(
        tmp_path, srv.url, "--api", api, "--dataset", "random", "--input-len", "20",
        "--output-len", "8", "--num-prompts", "8", "--request-rate", "20", "--ignore-eos",
        "--tokenizer", str(model_dir), "--cdf-png", str(png),
    )  # fmt: skip
    after = scrape(srv.url)
    s = data["summary"]
    assert rc == 0 and (s["num_completed"], s["num_errors"]) == (8, 0)
    assert s["total_output_tokens"] == 8 * 8
    assert delta(after, before, "paternoster:generation_tokens_total") == 8 * 8
    for r in data["requests"]:
        assert r["output_tokens_source"] == "usage" and r["output_tokens"] == 8
        assert r["ttft"] > 0 and r["e2e"] >= r["ttft"] and r["finish_reason"] == "length"
        if api == "completions":
            assert r["prompt_tokens"] == 20  # --tokenizer hits the length exactly
        else:
            assert r["prompt_tokens"] > 20  # plus the chat template
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert data["config"]["model"] == model_dir.name  # from GET /v1/models


def test_mix_fits_the_served_context(fake_server, tmp_path):
    srv, _ = fake_server
    rc, data = _bench(tmp_path, srv.url, "--num-prompts", "12", "--max-concurrency", "4",
                      "--ignore-eos", "--api", "chat")  # fmt: skip
    s = data["summary"]
    assert rc == 0 and s["num_errors"] == 0 and s["num_completed"] == 12
    assert {r["tag"] for r in data["requests"]} <= {"short", "summary", "long_gen", "long_prompt"}
    assert all(r["prompt_tokens"] + r["output_tokens"] <= 256 for r in data["requests"])


def test_wrong_model_is_counted_as_errors(fake_server, tmp_path):
    srv, _ = fake_server
    rc, data = _bench(tmp_path, srv.url, "--model", "no-such-model", "--num-prompts", "3")
    assert rc == 1
    assert data["summary"]["num_errors"] == 3
    assert next(iter(data["summary"]["errors"])).startswith("HTTP 404")
