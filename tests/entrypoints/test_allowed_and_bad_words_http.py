"""vLLM's allowed_token_ids and bad_words through the HTTP API on the default
model in float32, against HF transformers' own logits."""

from __future__ import annotations

import torch

from paternoster.sampling_params import SamplingParams
from tests.entrypoints.test_openai_params import PROMPT, f32_server, hf, hf_greedy, post  # noqa: F401


def test_allowed_token_ids_pick_hf_argmax_among_them(f32_server, hf, tokenizer):  # noqa: F811
    ids = tokenizer(PROMPT).input_ids
    _, lp = hf_greedy(hf, ids, 1)
    allowed = torch.argsort(lp[0], descending=True)[5:9].tolist()  # not the free choice
    want = allowed[int(torch.argmax(lp[0, allowed]))]
    r = post(f32_server, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0,
                                             "allowed_token_ids": allowed, "logprobs": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"] == [tokenizer.decode([want])]


def test_bad_words_never_appear_and_the_next_best_token_is_hf_argmax(f32_server, hf,  # noqa: F811
                                                                      tokenizer):
    ids = tokenizer(PROMPT).input_ids
    free, lp = hf_greedy(hf, ids, 1)
    word = tokenizer.decode(free).strip()  # the word greedy decoding would say first
    banned = SamplingParams(bad_words=[word]).prepare(tokenizer).bad_words_token_ids
    singles = [s[0] for s in banned if len(s) == 1]
    assert free[0] in singles
    masked = lp[0].clone()
    masked[singles] = float("-inf")
    want = int(torch.argmax(masked))
    r = post(f32_server, "/v1/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0,
                                             "bad_words": [word], "logprobs": 0}).json()
    assert r["choices"][0]["logprobs"]["tokens"][0] == tokenizer.decode([want])
    assert word not in r["choices"][0]["text"]


def test_allowed_token_ids_outside_the_vocabulary_are_a_400(f32_server, tokenizer):  # noqa: F811
    r = post(f32_server, "/v1/completions", {"prompt": "x", "allowed_token_ids": [len(tokenizer)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids"


def test_masks_that_leave_no_token_do_not_kill_the_engine(f32_server, tokenizer):  # noqa: F811
    """allowed_token_ids=[EOS] with min_tokens holding EOS back masks every
    token: the allowed one wins (it used to sample outside the vocabulary and
    crash the engine for every request in flight)."""
    for temperature in (1.0, 0.0):
        r = post(f32_server, "/v1/completions", {
            "prompt": PROMPT, "max_tokens": 3, "temperature": temperature, "seed": 3,
            "allowed_token_ids": [tokenizer.eos_token_id], "min_tokens": 1})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "stop"
    import httpx

    assert httpx.get(f32_server.url + "/health").status_code == 200
