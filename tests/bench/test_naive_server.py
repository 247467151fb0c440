"""The naive baseline server (bench/naive_server.py) on a tiny random Llama with a
tiny ASCII BPE tokenizer: its text equals HF ``generate``'s, streamed or not, usage
counts are exact, and concurrent requests run strictly one after the other."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from tests.entrypoints.utils import REPO_ROOT, child_env, free_port

CORPUS = [
    "the engine keeps every cabin moving while passengers step on and off",
    "at each floor nobody waits forever for a ride to the top of the tower",
    "a paternoster is the lift that never stops: cabins keep moving",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
PROMPT = "the lift keeps moving"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 2-layer random Llama (float32) and a ~200-token byte-level BPE trained on
    ASCII text (every token decodes to valid text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    bpe.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    LlamaForCausalLM(cfg).float().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf(tiny_dir):
    """The same model and tokenizer loaded here: the independent reference."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    return (
        AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval(),
        AutoTokenizer.from_pretrained(tiny_dir),
    )


@pytest.fixture(scope="module")
def url(tiny_dir):
    port = free_port()
    cmd = [sys.executable, "-m", "paternoster.bench.naive_server", str(tiny_dir)]
    proc = subprocess.Popen(cmd + ["--port", str(port)], env=child_env(), cwd=REPO_ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"naive server exited with {proc.returncode}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "naive server did not start"
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reference(hf, ids: list[int], n: int) -> str:
    """HF ``generate``, greedy, EOS disabled, ``n`` new tokens, decoded."""
    model, tok = hf
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=2)  # fmt: skip
    new = out[0, len(ids) :].tolist()
    assert len(new) == n
    return tok.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def stream(url: str, path: str, body: dict) -> list[tuple[float, dict]]:
    """POST with ``stream`` on; the SSE chunks with their arrival times (monotonic s)."""
    chunks = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return chunks
            chunks.append((time.monotonic(), json.loads(line[len("data: ") :])))
    raise AssertionError("stream ended without [DONE]")


def test_models_lists_the_served_model(url, tiny_dir):
    data = httpx.get(url + "/v1/models").json()["data"]
    assert [m["id"] for m in data] == [tiny_dir.name]


def test_greedy_completion_matches_hf_generate(url, hf):
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    ids = hf[1](PROMPT).input_ids
    assert r["choices"][0]["text"] == reference(hf, ids, 24)
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 24,
                          "total_tokens": len(ids) + 24}  # fmt: skip


def test_streamed_chunks_concatenate_to_the_same_text(url, hf):
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks = [c for _, c in stream(url, "/v1/completions", body)]
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    ids = hf[1](PROMPT).input_ids
    assert text == reference(hf, ids, 24)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-1]["usage"]["prompt_tokens"] == len(ids)


def test_chat_stream_uses_the_chat_template(url, hf):
    messages = [{"role": "user", "content": "ride to the top"}]
    body = {"messages": messages, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks = [c for _, c in stream(url, "/v1/chat/completions", body)]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(ch["delta"].get("content", "") for c in chunks for ch in c["choices"])
    templated = hf[1].apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = hf[1](templated, add_special_tokens=False).input_ids
    assert text == reference(hf, ids, 16)
    assert chunks[-1]["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 16,
                                   "total_tokens": len(ids) + 16}  # fmt: skip


def test_stop_string_cuts_the_text_before_it(url, hf):
    full = reference(hf, hf[1](PROMPT).input_ids, 24)
    stop = full[8:11]
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "stop": [stop]}  # fmt: skip
    choice = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop"


def test_bad_request_is_400_naming_the_field(url):
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "n": 2}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "n"


def test_concurrent_requests_are_served_one_after_the_other(url):
    body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    spans: list[tuple[float, float]] = []

    def client() -> None:
        times = [t for t, c in stream(url, "/v1/completions", body) if c["choices"][0]["text"]]
        spans.append((times[0], times[-1]))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(spans) == 2
    first, second = sorted(spans)
    # Second's first token after first's last. The times are taken in two client
    # threads, so the arrivals can swap by a few ms; served side by side, the second
    # stream would start near the first's start, a whole generation earlier.
    assert second[0] > first[1] - 0.25 * (first[1] - first[0])
