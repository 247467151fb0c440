"""Automatic prefix caching end to end on the default model: greedy outputs with
caching on are identical to caching off, and the cache really hits.

Workloads: prompts sharing a long prefix (whole blocks and a partial block),
a prompt that is a prefix of another, a repeated prompt, and all of them under
preemption (a KV cache too small for the batch).
"""

from __future__ import annotations

import pytest

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.sampling_params import SamplingParams

from .conftest import make_request
from .test_engine_core import TEXT

MAX_NEW_TOKENS = 12
BLOCK_SIZE = 8


@pytest.fixture(scope="module")
def text_ids(default_model_path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    return tok(TEXT, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def workload(text_ids) -> list[list[int]]:
    system = text_ids[:100]  # 12.5 blocks of 8: the shared prefix ends mid-block
    q = text_ids[150:]
    return [
        system + q[0:20],
        system + q[30:45],
        system + q[60:61],  # one token past the shared prefix
        text_ids[:40],  # a prefix of the prompts above (5 whole blocks)
        text_ids[:41],
        text_ids[:96],  # 12 whole blocks: only 11 can hit (the last token is recomputed)
        system + q[0:20],  # a repeat of the first prompt
        text_ids[3:90],  # no shared prefix
    ]


def make_engine(path, caching: bool, num_kv_blocks: int, scheduler: str = "fcfs") -> EngineCore:
    return EngineCore(
        EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32", max_model_len=256),
            cache=CacheConfig(
                block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks,
                enable_prefix_caching=caching,
            ),
            scheduler=SchedulerConfig(
                scheduler=scheduler, max_num_seqs=4, max_num_batched_tokens=256
            ),
        )
    )  # fmt: skip


def run(engine: EngineCore, prompts: list[list[int]], per_step: int) -> dict[str, list[int]]:
    """Submit ``per_step`` prompts per step; collect each request's greedy tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    for _ in range(10_000):
        for _ in range(per_step):
            if pending:
                i, p = pending.pop(0)
                engine.add_request(make_request(f"p{i}", p, params))
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        if not pending and not engine.has_unfinished_requests():
            break
    assert all(len(t) == MAX_NEW_TOKENS for t in tokens.values())
    assert len(tokens) == len(prompts)
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_kv_blocks"]  # no block leaked
    return tokens


@pytest.mark.parametrize(
    ("num_kv_blocks", "per_step", "scheduler"),
    [
        (256, 1, "fcfs"),  # one at a time: later prompts hit earlier ones' blocks
        (256, 2, "fcfs"),  # overlapping requests
        (24, 4, "fcfs"),  # too small for the batch: preemptions
        (24, 4, "chunked_prefill"),
    ],
)
def test_greedy_outputs_identical_with_and_without_caching(
    default_model_path, workload, num_kv_blocks, per_step, scheduler
):
    off = make_engine(default_model_path, False, num_kv_blocks, scheduler)
    want = run(off, workload, per_step)
    assert off.stats()["prefix_cache_queries"] == 0
    on = make_engine(default_model_path, True, num_kv_blocks, scheduler)
    got = run(on, workload, per_step)
    for i in range(len(workload)):
        assert got[f"p{i}"] == want[f"p{i}"], f"prompt {i} ({len(workload[i])} tokens)"
    stats = on.stats()
    assert stats["prefix_cache_hits"] > 0
    assert stats["prefix_cache_hits"] <= stats["prefix_cache_queries"]
    if num_kv_blocks < 100 and scheduler == "fcfs":  # chunked_prefill admits cautiously
        assert stats["num_preemptions_total"] > 0


def test_sequential_hits_are_whole_blocks_and_leave_the_last_token(default_model_path, text_ids):
    engine = make_engine(default_model_path, True, 256)
    run(engine, [text_ids[:96]], 1)
    before = engine.stats()["prefix_cache_hits"]
    run(engine, [text_ids[:96]], 1)  # same prompt: 11 of 12 blocks
    assert engine.stats()["prefix_cache_hits"] - before == 88
    run(engine, [text_ids[:45]], 1)  # 5 whole blocks of the cached prefix
    assert engine.stats()["prefix_cache_hits"] - before == 88 + 40
    record = engine.step_log[-MAX_NEW_TOKENS]  # the last request's prefill step
    assert record.scheduled[0][1] == 5  # 45 - 40 tokens computed


def test_reset_prefix_cache_and_caching_off(default_model_path, text_ids):
    engine = make_engine(default_model_path, True, 256)
    run(engine, [text_ids[:50]], 1)
    # KV was computed for the 50 prompt tokens and 11 of the 12 outputs: 7 blocks.
    assert engine.reset_prefix_cache() == 7
    hits = engine.stats()["prefix_cache_hits"]
    run(engine, [text_ids[:50]], 1)
    assert engine.stats()["prefix_cache_hits"] == hits  # nothing left to hit
    off = make_engine(default_model_path, False, 256)
    run(off, [text_ids[:50], text_ids[:50]], 1)
    assert off.reset_prefix_cache() == 0
    assert off.stats()["prefix_cache_hits"] == 0


def test_no_prefix_caching_flag():
    import argparse

    from paternoster.entrypoints.engine_args import (
        ENGINE_ARG_NAMES,
        add_engine_args,
        build_engine_config,
    )

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for argv, want in (([], True), (["--no-prefix-caching"], False)):
        args = parser.parse_args(argv)
        cfg = build_engine_config("/m", **{k: getattr(args, k) for k in ENGINE_ARG_NAMES})
        assert cfg.cache.enable_prefix_caching is want


def _hits_of(engine: EngineCore, prompt: list[int], salt: str | None, rid: str) -> int:
    """Prefix-cache hit tokens of one greedy request with ``cache_salt=salt``."""
    before = engine.stats()["prefix_cache_hits"]
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    engine.add_request(make_request(rid, prompt, params, cache_salt=salt))
    while engine.has_unfinished_requests():
        engine.step()
    return engine.stats()["prefix_cache_hits"] - before


def test_cache_salt_shares_blocks_only_between_equal_salts(default_model_path, text_ids):
    """vLLM's per-request ``cache_salt``: the same prompt under another salt (or
    none) computes every block again; under the same salt it hits."""
    engine = make_engine(default_model_path, True, 256)
    prompt = text_ids[:49]  # 6 whole blocks of 8
    assert _hits_of(engine, prompt, "tenant-a", "a1") == 0
    assert _hits_of(engine, prompt, "tenant-b", "b1") == 0
    assert _hits_of(engine, prompt, None, "n1") == 0
    assert _hits_of(engine, prompt, "tenant-a", "a2") == 48
    assert _hits_of(engine, prompt, None, "n2") == 48
