"""Batch-invariant mode (``--batch-invariant``) on the real default model in
bfloat16: a greedy request's token ids and logprobs are bit-identical alone,
inside a batch of 31 others, with its prompt chunked, after a prefix-cache hit
and after preemption. The reference is the same request run alone in a fresh
engine; each case also checks that its condition really happened (several
sequences per step, chunks, cache hits, preemptions)."""

from __future__ import annotations

import random

import pytest

from paternoster import LLM, SamplingParams

PROMPT = ("The quick brown fox jumps over the lazy dog. Paged attention keeps the key-value "
          "cache in fixed-size blocks, so a serving engine can")
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3,
                        prompt_logprobs=2)
ENGINE = dict(dtype="bfloat16", batch_invariant=True, num_threads=2, max_model_len=1024,
              max_num_seqs=32)


def _key(output, prompt_logprobs: bool = True) -> tuple:
    """Everything that must not change: ids, sampled and prompt logprobs."""
    choice = output.outputs[0]
    prompt = repr(output.prompt_logprobs) if prompt_logprobs else None
    return (list(choice.token_ids), repr(choice.logprobs), prompt)


def _others(tokenizer, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = len(tokenizer)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(8, 90))] for _ in range(n)]


@pytest.fixture(scope="module")
def alone():
    llm = LLM(**ENGINE, enable_prefix_caching=False)
    return _key(llm.generate([PROMPT], PARAMS)[0]), llm.tokenizer


def test_inside_a_batch_of_32(alone):
    reference, tokenizer = alone
    llm = LLM(**ENGINE, enable_prefix_caching=False)
    others = _others(tokenizer, 31, 0)
    prompts = others[:13] + [tokenizer.encode(PROMPT)] + others[13:]
    outs = llm.generate(prompts, PARAMS)
    assert llm.engine.stats()["num_steps"] < 24 * 8  # steps ran many sequences at once
    assert _key(outs[13]) == reference


def test_chunked_prompt(alone):
    reference, _ = alone
    llm = LLM(**ENGINE, enable_prefix_caching=False, scheduler="chunked_prefill",
              max_num_batched_tokens=7)
    out = llm.generate([PROMPT], PARAMS)[0]
    assert len(out.prompt_token_ids) > 7  # the prompt took several steps
    assert _key(out) == reference


def test_prefix_cache_hit(alone):
    """(Prompt logprobs turn the cache off for their request, as in vLLM, so
    this case compares ids and sampled logprobs.)"""
    reference, _ = alone
    llm = LLM(**ENGINE, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=3)
    first = llm.generate([PROMPT], params)[0]
    hits = llm.engine.stats()["prefix_cache_hits"]
    second = llm.generate([PROMPT], params)[0]
    assert llm.engine.stats()["prefix_cache_hits"] > hits  # the re-run hit the cache
    assert _key(first, False) == reference[:2] + (None,)
    assert _key(second, False) == reference[:2] + (None,)


def test_preempted(alone):
    reference, tokenizer = alone
    llm = LLM(**ENGINE, enable_prefix_caching=False, num_kv_blocks=24)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    others = _others(tokenizer, 7, 1)
    outs = llm.generate([tokenizer.encode(PROMPT)] + others, [PARAMS] + [params] * 7)
    assert llm.engine.stats()["num_preemptions_total"] > 0
    assert _key(outs[0]) == reference
