"""GuideLLM, a third-party benchmark tool, run unmodified against `paternoster serve`.

GuideLLM lives in its own venv (it pins its own dependencies and pulls torch):
`make compat-tools` installs it into build/compat and `.ci/run` points
``PATERNOSTER_GUIDELLM`` at its executable. Without it the test is skipped.
docs/compatibility.md has the commands and results for the other tools.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

GUIDELLM = os.environ.get("PATERNOSTER_GUIDELLM") or shutil.which("guidellm")
NUM_REQUESTS = 8
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 16

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not GUIDELLM,
        reason="GuideLLM not installed: `make compat-tools`, then set "
        "PATERNOSTER_GUIDELLM=build/compat/bin/guidellm (.ci/run does both)",
    ),
]

COUNTER = re.compile(
    r"^paternoster:(prompt_tokens_total|generation_tokens_total|request_success_total)"
    r'(?:\{finished_reason="(\w+)"\})? ([0-9.e+]+)$'
)


def _counters(server) -> dict[str, float]:
    """The server's own token and request counters from /metrics."""
    out = {}
    for line in server.get("/metrics").text.splitlines():
        m = COUNTER.match(line)
        if m:
            name, reason, value = m.groups()
            out[f"{name}:{reason}" if reason else name] = float(value)
    return out


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_guidellm_benchmark_completes_and_counts_match_ours(
    server, default_model_path, tmp_path, route
):
    report = tmp_path / "guidellm.json"
    cmd = [
        GUIDELLM, "run",
        "--backend", f"kind=openai_http,target={server.url},"
                     f"model=SmolLM2-135M-Instruct,request_format={route}",
        "--tokenizer", f"kind=huggingface_auto,model={default_model_path}",
        "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                  f"output_tokens={OUTPUT_TOKENS}",
        "--profile", "kind=concurrent,streams=4",
        "--constraint", f"kind=max_requests,count={NUM_REQUESTS}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    before = _counters(server)
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    after = _counters(server)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}

    bench = json.loads(report.read_text())["benchmarks"][0]
    assert bench["metrics"]["request_totals"] == {
        "successful": NUM_REQUESTS, "errored": 0, "incomplete": 0, "total": NUM_REQUESTS,
    }  # fmt: skip
    done = bench["requests"]["successful"]
    assert len(done) == NUM_REQUESTS and not bench["requests"]["errored"]
    assert all(r["info"]["error"] is None and r["output"] for r in done)
    # GuideLLM sends ignore_eos: every request runs to its max tokens.
    assert [r["output_tokens"] for r in done] == [OUTPUT_TOKENS] * NUM_REQUESTS
    # Its totals are what our server counted: no request retried, lost or miscounted.
    totals = {k: v["successful"]["total_sum"] for k, v in bench["metrics"].items()
              if k in ("output_token_count", "prompt_token_count")}  # fmt: skip
    assert totals["output_token_count"] == delta["generation_tokens_total"]
    assert totals["prompt_token_count"] == delta["prompt_tokens_total"]
    assert delta["request_success_total:length"] == NUM_REQUESTS
    assert delta["request_success_total:error"] == delta["request_success_total:abort"] == 0
    if route == "/v1/completions":  # no chat template: the synthetic prompt as asked
        assert [r["prompt_tokens"] for r in done] == [PROMPT_TOKENS] * NUM_REQUESTS
