"""The client protocol on the real default model (float32) against HF
transformers' own greedy ``generate`` and forward: tokens, text, logprobs, and
several requests batched together."""

from __future__ import annotations

import asyncio

import pytest
import torch

from paternoster.client import AsyncClient, Client
from tests.entrypoints.test_openai_params import hf_greedy
from tests.entrypoints.utils import free_port, start_server

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a lift,"]
N = 12
ATOL = 2e-3  # our CPU kernels vs HF's forward, both float32


@pytest.fixture(scope="module")
def address(default_model_path):
    addr = f"tcp://127.0.0.1:{free_port()}"
    with start_server(
        str(default_model_path), "--dtype", "float32", "--num-kv-blocks", "256",
        "--max-model-len", "1024", "--zmq-address", addr,
    ):  # fmt: skip
        yield addr


@pytest.fixture(scope="module")
def hf(default_model_path):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(default_model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path))


def test_greedy_tokens_and_logprobs_match_hf(address, hf, tokenizer):
    ids = tokenizer(PROMPTS[0]).input_ids
    ref, ref_lp = hf_greedy(hf, ids, N)
    with Client(address, timeout=60) as c:
        done = c.generate(PROMPTS[0], max_tokens=N, temperature=0, ignore_eos=True, logprobs=2)
        pieces = list(c.stream(prompt_token_ids=ids, max_tokens=N, temperature=0,
                               ignore_eos=True))  # fmt: skip
    assert done.token_ids == ref
    assert done.text == tokenizer.decode(ref, skip_special_tokens=True)
    assert [t for d in pieces for t in d.token_ids] == ref
    token_lps, top_ids, top_lps = done.logprobs
    want = ref_lp[torch.arange(N), torch.tensor(ref)]
    assert torch.allclose(torch.tensor(token_lps), want, atol=ATOL)
    assert [row[0] for row in top_ids] == ref  # greedy: the chosen token is the most likely
    assert torch.allclose(torch.tensor(top_lps)[:, 0], want, atol=ATOL)


def test_concurrent_requests_each_match_hf(address, hf, tokenizer):
    refs = [hf_greedy(hf, tokenizer(p).input_ids, N)[0] for p in PROMPTS]

    async def run():
        async with await AsyncClient.connect(address, timeout=60) as c:
            return await asyncio.gather(*(
                c.generate(p, max_tokens=N, temperature=0, ignore_eos=True) for p in PROMPTS
            ))  # fmt: skip

    outs = asyncio.run(run())
    assert [o.token_ids for o in outs] == refs


def test_logit_bias_forces_a_token(address, tokenizer):
    """A +100 bias makes greedy decoding pick that token every time (OpenAI's
    semantics), sent as the Python client's dict and as wire pairs alike."""
    token = tokenizer(" lift", add_special_tokens=False).input_ids[0]
    with Client(address, timeout=60) as c:
        for bias in ({token: 100.0}, [[token, 100.0]]):
            done = c.generate(PROMPTS[0], max_tokens=4, temperature=0, logit_bias=bias)
            assert done.token_ids == [token] * 4
