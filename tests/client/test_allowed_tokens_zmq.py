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


def test_structured_outputs_over_zmq(address):  # noqa: F811
    """A JSON schema and a choice through the ZeroMQ protocol (the sampling
    map's structured_outputs field), a bad regex refused naming the field."""
    import json

    import pytest

    from paternoster.client import BadRequestError

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    with Client(address, timeout=60) as c:
        done = c.generate("A number as JSON:", max_tokens=40, temperature=0.9, seed=1,
                          structured_outputs={"json": schema})
        assert done.finish_reason == "stop"
        value = json.loads(done.text)
        assert set(value) == {"n"} and isinstance(value["n"], int)
        picked = c.generate("Pick one:", max_tokens=8, temperature=1.0, seed=2,
                            structured_outputs={"choice": ["heads", "tails"]})
        assert picked.text in ("heads", "tails")
        with pytest.raises(BadRequestError, match="structured_outputs"):
            c.generate("x", max_tokens=4, structured_outputs={"regex": "a(b"})
