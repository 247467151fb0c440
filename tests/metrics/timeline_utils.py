"""Small worlds for timeline tests: a tiny random-weight Llama behind a real EngineCore,
and a structural check of Chrome traces."""

from __future__ import annotations

import json
from pathlib import Path

from paternoster.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    TimelineConfig,
)
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreRequest
from paternoster.sampling_params import SamplingParams

TINY_LLAMA = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=96, hidden_size=64,
    intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
    tie_word_embeddings=False,
)  # fmt: skip


def write_tiny_model(folder: Path) -> Path:
    """A model directory holding only config.json (load it with ``load_format="dummy"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def make_engine(
    model_dir: Path,
    timeline: TimelineConfig | None = None,
    scheduler: str = "chunked_prefill",
    num_kv_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 16,
    max_model_len: int = 128,
) -> EngineCore:
    """A real EngineCore over the tiny random-weight model (float32, CPU)."""
    return EngineCore(
        EngineConfig(
            model=ModelConfig(
                model=str(model_dir), dtype="float32", load_format="dummy",
                max_model_len=max_model_len,
            ),
            cache=CacheConfig(block_size=block_size, num_kv_blocks=num_kv_blocks),
            scheduler=SchedulerConfig(
                scheduler=scheduler, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
            ),
            timeline=timeline or TimelineConfig(),
        )
    )  # fmt: skip


def run_requests(
    engine: EngineCore, prompt_lens: list[int], max_tokens: int, after_step=None
) -> dict[str, int]:
    """Add one request per prompt length (ids ``r0``, ``r1``, ...), step until all
    finish; ``after_step(engine)`` runs after every step. Returns tokens per request."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, n in enumerate(prompt_lens):
        ids = [(i * 7 + j) % 90 + 1 for j in range(n)]
        engine.add_request(EngineCoreRequest(f"r{i}", ids, params))
    tokens: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] = tokens.get(out.request_id, 0) + len(out.new_token_ids)
        if after_step is not None:
            after_step(engine)
    return tokens


def check_chrome_trace(trace: dict) -> dict[int, list[dict]]:
    """Assert the Trace Event Format structure; return each request track's X events.

    Checks: JSON round trip; every event has a name, phase, pid and tid; X events
    have ts >= 0 and dur >= 0; every thread with events is named; events on one
    request track do not overlap.
    """
    trace = json.loads(json.dumps(trace))
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    named: set[tuple[int, int]] = set()
    tracks: dict[int, list[dict]] = {}
    used: set[tuple[int, int]] = set()
    for e in trace["traceEvents"]:
        assert {"name", "ph", "pid", "tid"} <= e.keys(), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
            continue
        assert e["ph"] in ("X", "i", "C"), e
        assert e["ts"] >= 0, e
        used.add((e["pid"], e["tid"]))
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
            if e["pid"] == 2:
                tracks.setdefault(e["tid"], []).append(e)
        if e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
    assert used <= named, used - named
    for tid, evs in tracks.items():
        evs.sort(key=lambda e: e["ts"])
        for a, b in zip(evs, evs[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (tid, a, b)
    return tracks
