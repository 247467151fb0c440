"""Soak (``pytest -m soak``; not in make test): 1,000 mixed requests (completions
and chat, streamed or not, ``n`` 1 or 2, random ``max_tokens``), about 30% of
whose clients go away at a random point, after a warm-up of the same mix.

Every request that was not cut off must get a whole answer (one finish reason
per choice, usage matching the prompt counted by the test's own tokenizer and
``max_tokens``); afterwards nothing is in flight, the engine is idle with every
KV block free, and the RSS of the frontend and of the engine process is within
10% of what it was after the warm-up. Run against the real engine (EngineCore,
ModelRunner and the C++ KV cache, over a tiny random-weight Llama with the
default model's 49 152-token vocabulary, so that text prompts work) and
against the fake engine (the frontend alone, at a higher request rate).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from dataclasses import dataclass, field

import httpx
import pytest

from tests.entrypoints.utils import Server, start_server
from tests.hardening.conftest import fake_server
from tests.metrics.utils import delta, scrape

NUM_REQUESTS = 1000
NUM_WARMUP = 200
ABORT_FRACTION = 0.3
RSS_TOLERANCE = 0.10  # fraction of the post-warm-up RSS
SUCCESS = "paternoster:request_success_total"

# The real engine's model: 2 layers of width 64, the default model's vocabulary.
TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def _rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


@dataclass
class Tally:
    """What the clients saw: requests answered whole (and their choices), cut
    off by their client, engine requests sent (``n`` per request), and the
    problems found."""

    complete: int = 0
    complete_choices: int = 0
    aborted: int = 0
    engine_requests: int = 0
    problems: list[str] = field(default_factory=list)


class Mix:
    """Draws random requests and checks their answers.

    Args:
        tokenizer: the served model's tokenizer, to count prompt tokens
            independently of the server.
        max_tokens: the largest ``max_tokens`` drawn.
    """

    def __init__(self, tokenizer, max_tokens: int):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens

    def draw(self, rng: random.Random) -> tuple[str, dict, int]:
        """``(path, body, prompt tokens)`` of one random request."""
        body = {"max_tokens": rng.randint(1, self.max_tokens), "stream": rng.random() < 0.6,
                "n": rng.choice([1, 1, 2]), "ignore_eos": rng.random() < 0.5}  # fmt: skip
        if body["stream"]:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": "Hi " * rng.randint(1, 30)}]
            body["messages"] = messages
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            prompt_len = len(self.tokenizer(text, add_special_tokens=False).input_ids)
            return "/v1/chat/completions", body, prompt_len
        body["prompt"] = "Once upon a time " * rng.randint(1, 12)
        return "/v1/completions", body, len(self.tokenizer(body["prompt"]).input_ids)

    @staticmethod
    def check(body: dict, prompt_len: int, choices: list[dict], usage: dict | None) -> list[str]:
        """Problems with a whole answer: each choice once with a finish reason, and
        usage equal to the prompt once plus each choice's tokens (``max_tokens``
        when cut by length, 1 to ``max_tokens`` when stopped by EOS)."""
        n, max_tokens = body["n"], body["max_tokens"]
        reasons = {c["index"]: c["finish_reason"] for c in choices}
        if sorted(reasons) != list(range(n)) or len(choices) != n:
            return [f"choices {sorted(reasons)} for n={n}"]
        allowed = {"length"} if body["ignore_eos"] else {"length", "stop"}
        if not set(reasons.values()) <= allowed:
            return [f"finish reasons {reasons} (ignore_eos={body['ignore_eos']})"]
        if usage is None:
            return ["no usage"]
        lengths = sum(1 for r in reasons.values() if r == "length")
        low, high = lengths * max_tokens + (n - lengths), n * max_tokens
        got = (usage["prompt_tokens"], usage["total_tokens"] - usage["completion_tokens"])
        if got != (prompt_len, prompt_len) or not low <= usage["completion_tokens"] <= high:
            return [f"usage {usage}: prompt {prompt_len}, completion in [{low}, {high}]"]
        return []


async def _one(http: httpx.AsyncClient, url: str, mix: Mix, rng: random.Random,
               tally: Tally) -> None:  # fmt: skip
    path, body, prompt_len = mix.draw(rng)
    tally.engine_requests += body["n"]
    cut = rng.random() < ABORT_FRACTION
    if body["stream"]:
        # Leave after a random number of events (the answer may end first).
        leave_after = rng.randint(1, body["max_tokens"] * body["n"] + 1) if cut else None
        events = []
        async with http.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                tally.problems.append(f"{path} {r.status_code}: {await r.aread()!r}")
                return
            async for line in r.aiter_lines():
                if line:
                    events.append(line)
                if leave_after is not None and len(events) >= leave_after:
                    break
        if not events or events[-1] != "data: [DONE]":
            tally.aborted += 1  # left mid-stream
            return
        chunks = [json.loads(e[6:]) for e in events[:-1]]
        errors = [c for c in chunks if "error" in c]
        if errors:
            tally.problems.append(f"{path} error event {errors[0]}")
            return
        finished = [ch for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
        usage = chunks[-1].get("usage") if chunks and not chunks[-1]["choices"] else None
        problems = mix.check(body, prompt_len, finished, usage)
    else:
        request = http.post(url + path, json=body)
        try:
            r = await (asyncio.wait_for(request, rng.uniform(0.05, 2.0)) if cut else request)
        except asyncio.TimeoutError:
            tally.aborted += 1  # the connection is closed mid-request
            return
        if r.status_code != 200:
            tally.problems.append(f"{path} {r.status_code}: {r.text}")
            return
        data = r.json()
        problems = mix.check(body, prompt_len, data["choices"], data.get("usage"))
    tally.complete += 1
    tally.complete_choices += body["n"]
    tally.problems.extend(f"{path} {body}: {p}" for p in problems)


async def _load(url: str, mix: Mix, count: int, concurrency: int, seed: int) -> Tally:
    """``count`` requests from ``concurrency`` clients at a time."""
    rng = random.Random(seed)
    tally = Tally()
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:

        async def bounded() -> None:
            async with sem:
                await _one(http, url, mix, rng, tally)

        await asyncio.gather(*(bounded() for _ in range(count)))
    return tally


def _idle(s: dict) -> bool:
    e = s["engine"]
    return (s["num_in_flight"] == 0 and s["num_waiting"] == 0 and e["num_running"] == 0
            and e["num_waiting"] == 0 and e["kv_cache_usage"] == 0)  # fmt: skip


def _soak(srv: Server, mix: Mix, concurrency: int, budget_s: float) -> dict:
    """Warm up, measure RSS, run the soak, check everything; return the figures."""
    t0 = time.monotonic()
    warm = asyncio.run(
        asyncio.wait_for(_load(srv.url, mix, NUM_WARMUP, concurrency, seed=1), budget_s)
    )
    assert not warm.problems, warm.problems[:5]
    idle = srv.wait_for(_idle, timeout=60, what="idle after the warm-up")
    preempted = idle["engine"].get("num_preemptions_total", 0)
    pids = {"frontend": srv.proc.pid, "engine": srv.engine_pid()}
    before = {k: _rss_kib(p) for k, p in pids.items()}
    metrics_before = scrape(srv.url)
    t1 = time.monotonic()
    tally = asyncio.run(
        asyncio.wait_for(_load(srv.url, mix, NUM_REQUESTS, concurrency, seed=2), budget_s)
    )
    t2 = time.monotonic()
    assert not tally.problems, (len(tally.problems), tally.problems[:5])
    assert tally.complete + tally.aborted == NUM_REQUESTS
    assert 0.1 * NUM_REQUESTS < tally.aborted < 0.45 * NUM_REQUESTS, tally.aborted
    stats = srv.wait_for(_idle, timeout=60, what="idle after the soak")
    assert stats["engine"]["num_free_blocks"] == stats["engine"]["num_kv_blocks"]
    after = {k: _rss_kib(p) for k, p in pids.items()}
    metrics_after = scrape(srv.url)
    by_reason = {r: delta(metrics_after, metrics_before, SUCCESS, finished_reason=r)
                 for r in ("stop", "length", "abort", "error")}  # fmt: skip
    assert by_reason["error"] == 0, by_reason
    assert sum(by_reason.values()) <= tally.engine_requests, (by_reason, tally)
    assert by_reason["abort"] > 0
    assert by_reason["stop"] + by_reason["length"] >= tally.complete_choices, (by_reason, tally)
    figures = {"warmup_s": round(t1 - t0, 1), "soak_s": round(t2 - t1, 1),
               "complete": tally.complete, "aborted": tally.aborted,
               "engine_requests": tally.engine_requests, "finished": by_reason,
               "preemptions": stats["engine"].get("num_preemptions_total", 0) - preempted,
               "rss_kib_before": before, "rss_kib_after": after}  # fmt: skip
    print("soak:", json.dumps(figures))
    for k in pids:
        assert after[k] <= before[k] * (1 + RSS_TOLERANCE), (k, before[k], after[k])
    return figures


@pytest.mark.soak
def test_soak_real_engine_keeps_rss_flat_and_leaks_nothing(fake_model_dir, tmp_path, tokenizer):
    # 128 blocks of 16 tokens (2 048 slots) for up to 32 running sequences of up to
    # ~200 tokens: the scheduler preempts often, which the soak must survive too.
    d = shutil.copytree(fake_model_dir, tmp_path / "tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    with start_server(
        str(d), "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "512",
        "--block-size", "16", "--num-kv-blocks", "128", "--max-num-seqs", "32",
        "--num-threads", "1", "--seed", "0", timeout=120,
    ) as srv:  # fmt: skip
        figures = _soak(srv, Mix(tokenizer, max_tokens=128), concurrency=24, budget_s=480)
    assert figures["preemptions"] > 0


@pytest.mark.soak
def test_soak_fake_engine_keeps_rss_flat(fake_model_dir, tokenizer):
    with fake_server(fake_model_dir, {"step_delay": 0.005}, "--num-kv-blocks", "8192") as srv:
        _soak(srv, Mix(tokenizer, max_tokens=48), concurrency=64, budget_s=300)
