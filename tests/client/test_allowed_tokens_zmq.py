"""allowed_token_ids and bad_words through the ZeroMQ client protocol (no
protocol change: the sampling map derives from SamplingParams)."""

from __future__ import annotations

import torch

from paternoster.client import Client
from tests.client.test_real_model import address, hf, tokenizer  # noqa: F401
from tests.entrypoints.test_openai_params import PROMPT, hf_greedy


def test_allowed_token_ids_and_bad_words_over_zmq(address, hf, tokenizer):  # noqa: F811
    ids = tokenizer(PROMPT).input_ids
    free, lp = hf_greedy(hf, ids, 1)
    allowed = torch.argsort(lp[0], descending=True)[3:7].tolist()
    want = allowed[int(torch.argmax(lp[0, allowed]))]
    with Client(address, timeout=60) as c:
        done = c.generate(prompt_token_ids=ids, max_tokens=3, temperature=0,
                          allowed_token_ids=allowed)  # fmt: skip
        assert done.token_ids[0] == want and set(done.token_ids) <= set(allowed)
        word = tokenizer.decode(free).strip()
        banned = c.generate(prompt_token_ids=ids, max_tokens=8, temperature=0, bad_words=[word])
        assert banned.token_ids[0] != free[0] and word not in banned.text
