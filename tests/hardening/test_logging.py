"""At the default log level (info) neither process logs prompt or output text."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time

import httpx

from tests.entrypoints.utils import REPO_ROOT, child_env, free_port
from tests.hardening.conftest import QUEUEING_ENGINE

SECRET = "zebra-violet-quartz"


def test_no_prompt_or_output_text_in_logs_at_info(fake_model_dir, tmp_path, tokenizer):
    d = tmp_path / "model"
    shutil.copytree(fake_model_dir, d)
    out_tokens = tokenizer(" unicorn-marmalade").input_ids
    (d / "fake_engine.json").write_text(json.dumps({"tokens": out_tokens}))
    port = free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(d),
           "--engine-cls", QUEUEING_ENGINE, "--port", str(port)]  # fmt: skip
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO_ROOT, stdout=f, stderr=f)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        body = {"prompt": f"The password is {SECRET}", "max_tokens": len(out_tokens)}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert "marmalade" in r.json()["choices"][0]["text"]
        chat = {"messages": [{"role": "user", "content": SECRET}], "max_tokens": 2,
                "stream": True}  # fmt: skip
        assert httpx.post(url + "/v1/chat/completions", json=chat, timeout=30).status_code == 200
        bad = {"prompt": SECRET, "temperature": -1}
        assert httpx.post(url + "/v1/completions", json=bad, timeout=30).status_code == 400
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    text = log.read_text()
    assert "POST /v1/completions" in text  # the access log is on at info
    assert SECRET not in text and "marmalade" not in text
