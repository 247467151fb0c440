"""The `paternoster` command's argument parsing and startup failures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from paternoster.entrypoints.cli import make_parser
from paternoster.entrypoints.engine_args import (
    ENGINE_ARG_NAMES,
    build_engine_config,
    parse_bytes,
    parse_scheduler_config,
)
from tests.entrypoints.utils import REPO_ROOT, child_env


def test_parse_bytes_accepts_plain_and_suffixed_sizes():
    assert parse_bytes("1073741824") == 1 << 30
    assert parse_bytes("2GiB") == 2 << 30
    assert parse_bytes("512 MiB") == 512 << 20
    assert parse_bytes("1.5GB") == 1_500_000_000
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_scheduler_config_is_a_json_object_inline_or_in_a_file(tmp_path):
    assert parse_scheduler_config('{"ttft_s": 2}') == {"ttft_s": 2}
    nested = parse_scheduler_config('{"classes": {"1": {"ttft_s": 1}}, "w": [{"a": 1}]}')
    assert nested == {"classes": {"1": {"ttft_s": 1}}, "w": [{"a": 1}]}
    assert type(nested["classes"]["1"]) is dict and type(nested["w"][0]) is dict
    path = tmp_path / "slo.json"
    path.write_text('{"itl_s": 0.1}')
    assert parse_scheduler_config(str(path)) == {"itl_s": 0.1}
    for value, match in [("[]", "must be a JSON object, got list"),
                         ("3", "must be a JSON object, got int"),
                         ("{bad", "is not valid JSON"),
                         ("", "is empty"), ("  ", "is empty"),
                         ('{"margin": 0.1, "margin": 0.2}', "gives the key 'margin' twice$"),
                         ('{"classes": {"1": {"ttft_s": 1, "ttft_s": 2}}}',
                          r"gives the key 'ttft_s' twice in classes\.1$"),
                         ('{"w": [{"a": 1, "a": 1}]}', r"key 'a' twice in w\[0\]$"),
                         (str(tmp_path / "none.json"), "or the path of a JSON file; .* no such"),
                         ("not json", "'not json' is not JSON and no such file exists"),
                         (str(tmp_path), "cannot be read")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            parse_scheduler_config(value)
    path.write_text("[1]")
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        parse_scheduler_config(str(path))
    path.write_text('{"itl_s": 0.1}')
    assert parse_scheduler_config(path) == {"itl_s": 0.1}  # a pathlib.Path
    for value in ([1], 5):
        with pytest.raises(ValueError, match="must be a dict, a JSON object string or a file"):
            parse_scheduler_config(value)


@pytest.mark.parametrize("scheduler,config,match", [
    ("slo", {"ttft_s": -1}, "ttft_s must be a number of seconds > 0"),
    ("slo", {"margin": 2}, "margin must be a number in"),
    ("slo", {"cost_model": "/no/such/model.json"}, "cost_model"),
    ("chunked_prefill", {"long_prefill_token_threshold": -5}, "long_prefill_token_threshold"),
    ("chunked_prefill", {"long_prefill_token_threshold": True},
     r"long_prefill_token_threshold must be an integer in \[0, 2\*\*63 - 1\], got true$"),
    ("chunked_prefill", {"long_prefill_token_threshold": 10**23},
     "long_prefill_token_threshold must be an integer in"),  # past msgpack's int64
    ("priority", {"aging_steps": "often"}, 'aging_steps must be an integer in .*, got "often"$'),
    ("slo", {"ttft_s": 10**400}, "ttft_s must be a number of seconds > 0, got 1000"),
    ("fair", {"input_token_weight": 10**400},
     r"input_token_weight must be a number in \[0, 1000\]"),
    ("slo", {"load_shedding": None}, "load_shedding must be true or false, got null$"),
    ("fair", {"input_token_weight": 0, "output_token_weight": 0}, "must not both be 0"),
    ("fair", {"tenant_weights": {"a": -1}},
     r'tenant_weights\["a"\] must be a number in \[0.001, 1000\]'),
    ("fair", {"tenant_weights": {"a": 0}},
     r'tenant_weights\["a"\] must be a number in \[0.001, 1000\]'),
    ("slo", {"classes": {"1": {"ttft_s": 1}, "01": {"ttft_s": 2}}}, "priority 1 twice"),
    ("fair", {"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
])  # fmt: skip
def test_bad_scheduler_config_values_fail_when_the_config_is_built(scheduler, config, match):
    # Before the model loads: build_engine_config reads no model files.
    with pytest.raises(ValueError, match=match):
        build_engine_config("/no/such/model", scheduler=scheduler, scheduler_config=config)
    ok = {"slo": {"ttft_s": 1}, "chunked_prefill": {"long_prefill_token_threshold": 64},
          "priority": {"aging_steps": 5}, "fair": {"tenant_weights": {"a": 2}}}[scheduler]
    cfg = build_engine_config("/no/such/model", scheduler=scheduler, scheduler_config=ok)
    assert cfg.scheduler.policy_config == ok


def test_serve_flags_build_the_engine_config():
    args = make_parser().parse_args(
        ["serve", "/m", "--dtype", "float32", "--max-model-len", "512", "--block-size", "32",
         "--kv-cache-memory", "1GiB", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
         "--num-threads", "2", "--seed", "3", "--served-model-name", "m"]
    )  # fmt: skip
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    cfg = build_engine_config(args.model, **{k: getattr(args, k) for k in ENGINE_ARG_NAMES})
    assert cfg.model.model == "/m" and cfg.model.dtype == "float32"
    assert cfg.model.max_model_len == 512 and cfg.model.served_model_name == "m"
    assert cfg.cache.block_size == 32 and cfg.cache.kv_cache_memory == 1 << 30
    assert cfg.scheduler.max_num_seqs == 8 and cfg.scheduler.max_num_batched_tokens == 256
    assert cfg.num_threads == 2 and cfg.seed == 3
    default = make_parser().parse_args(["serve"])
    assert default.model is None and default.num_threads == 0 and default.block_size == 16


def test_bad_flag_values_are_rejected():
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--dtype", "int3"])
    with pytest.raises(ValueError, match="block_size"):
        build_engine_config("/m", block_size=0)
    # an unknown policy option fails with the config, before any model is read
    with pytest.raises(ValueError, match=r"unknown scheduler_config keys for 'slo': \['ttft'\]"):
        build_engine_config("/no/such/model", scheduler="slo", scheduler_config='{"ttft": 2}')


def test_serve_with_a_missing_model_dir_exits_with_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(tmp_path / "nope")],
        env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot load model" in proc.stderr and "nope" in proc.stderr


def test_serve_reports_an_engine_that_fails_to_start(tmp_path, default_model_path):
    """The tokenizer loads, the model does not: the engine's reason is logged."""
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_path / name, tmp_path / name)
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(tmp_path),
         "--port", "0"],  # not 8000: another server on this machine must not matter
        env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "engine failed to start" in proc.stderr


def test_a_bad_thread_setting_is_one_clear_line(default_model_path):
    env = {**child_env(), "PATERNOSTER_NUM_THREADS": "abc"}
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(default_model_path),
         "--port", "0"],
        env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "PATERNOSTER_NUM_THREADS" in proc.stderr and "Traceback" not in proc.stderr


def test_serve_with_a_missing_chat_template_file_exits_with_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "paternoster.entrypoints.cli", "serve", str(tmp_path),
         "--chat-template", str(tmp_path / "nope.jinja")],
        env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "cannot read chat template" in proc.stderr and "nope.jinja" in proc.stderr


def test_serve_on_a_port_in_use_exits_before_loading(default_model_path):
    """Another server on the HTTP port: one line at once, not after loading."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "paternoster.entrypoints.cli", "serve",
             str(default_model_path), "--port", str(port), "--zmq-address", "none"],
            env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        holder.close()
    assert proc.returncode == 1
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in proc.stderr
    assert "engine ready" not in proc.stderr and "Traceback" not in proc.stderr
