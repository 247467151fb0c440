"""Logits processors on the same logits as independent references: HF's
``RepetitionPenaltyLogitsProcessor`` for the repetition penalty, a numpy
formula (OpenAI's definition) for presence/frequency penalties and logit_bias,
and rows that ask for nothing stay bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paternoster.model.logits_processors import apply_logits_processors
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams

VOCAB = 300
EOS = 7


def _logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def _request(prompt: list[int], output: list[int], **params) -> Request:
    r = Request("r", prompt, SamplingParams(**params), eos_token_id=EOS)
    r.output_token_ids = list(output)
    return r


def _history(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 40, n).tolist()  # many repeats


def _openai_penalties(logits: np.ndarray, output: list[int], presence: float,
                      frequency: float) -> np.ndarray:
    """OpenAI's formula: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence."""
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=VOCAB).astype(np.float64)
    return logits - counts * frequency - (counts > 0) * presence


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_hf(penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = _logits(3, seed=1)
    reqs = [_request(_history(i, 25), _history(10 + i, 9 * i), repetition_penalty=penalty)
            for i in range(3)]
    got = logits.clone()
    apply_logits_processors(got, reqs)
    hf = RepetitionPenaltyLogitsProcessor(penalty)
    for i, r in enumerate(reqs):
        ids = torch.tensor([r.prompt_token_ids + r.output_token_ids])
        want = hf(ids, logits[i : i + 1].clone())[0]
        torch.testing.assert_close(got[i], want, rtol=1e-6, atol=1e-6)


def test_presence_and_frequency_penalties_match_the_openai_formula():
    logits = _logits(4, seed=2)
    cases = [(0.0, 0.7), (1.5, 0.0), (-0.5, 2.0), (2.0, -2.0)]
    reqs = [
        _request(_history(20 + i, 30), _history(30 + i, 15 + 5 * i), presence_penalty=pp,
                 frequency_penalty=fp)
        for i, (pp, fp) in enumerate(cases)
    ]
    got = logits.clone()
    apply_logits_processors(got, reqs)
    for i, (r, (pp, fp)) in enumerate(zip(reqs, cases)):
        want = _openai_penalties(logits[i].double().numpy(), r.output_token_ids, pp, fp)
        np.testing.assert_allclose(got[i].numpy(), want, rtol=0, atol=1e-5)
    # The prompt does not count: a token only in the prompt keeps its logit.
    only_prompt = sorted(set(reqs[0].prompt_token_ids) - set(reqs[0].output_token_ids))
    assert torch.equal(got[0, only_prompt], logits[0, only_prompt])


def test_all_processors_compose_in_vllm_order():
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = _logits(1, seed=3)
    prompt, output = _history(40, 20), _history(41, 12)
    bias = {3: 5.0, 100: -30.0, EOS: 2.0}
    r = _request(prompt, output, logit_bias=bias, min_tokens=20, max_tokens=30,
                 repetition_penalty=1.4,
                 presence_penalty=0.3, frequency_penalty=0.2, stop_token_ids=[11])
    got = logits.clone()
    apply_logits_processors(got, [r])
    want = logits.clone()
    for t, b in bias.items():
        want[0, t] += b
    want[0, [EOS, 11]] = float("-inf")  # 12 < min_tokens tokens generated
    want = RepetitionPenaltyLogitsProcessor(1.4)(torch.tensor([prompt + output]), want)
    want = torch.from_numpy(_openai_penalties(want[0].double().numpy(), output, 0.3, 0.2))
    torch.testing.assert_close(got[0].double(), want, rtol=0, atol=1e-5)


def test_rows_without_processing_are_untouched():
    logits = _logits(5, seed=4)
    reqs = [_request([1, 2, 3], [4, 4], **kw) for kw in (
        {}, {"repetition_penalty": 1.2}, {"temperature": 0.0}, {"logit_bias": {9: 1.0}}, {},
    )]  # fmt: skip
    got = logits.clone()
    apply_logits_processors(got, reqs)
    for i in (0, 2, 4):
        assert torch.equal(got[i], logits[i])
    assert not torch.equal(got[1], logits[1]) and got[3, 9] == logits[3, 9] + 1.0


def test_min_tokens_mask_lifts_once_reached():
    logits = _logits(2, seed=5)
    reqs = [_request([1], [5] * 3, min_tokens=4), _request([1], [5] * 4, min_tokens=4)]
    got = logits.clone()
    apply_logits_processors(got, reqs)
    assert got[0, EOS] == float("-inf") and got[1, EOS] == logits[1, EOS]


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
     ("min_tokens", -1), ("logit_bias", {5: 101.0}), ("logit_bias", {-1: 1.0}),
     ("logprobs", 21), ("prompt_logprobs", -1)],
)  # fmt: skip
def test_out_of_range_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


def test_sampling_fields_round_trip_through_the_wire_dict():
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.1,
                       min_tokens=2, logit_bias={5: 1.5, 70: -100.0}, logprobs=3,
                       prompt_logprobs=0, include_stop_str_in_output=True,
                       skip_special_tokens=False)
    d = p.to_dict()
    assert d["logit_bias"] == [[5, 1.5], [70, -100.0]]  # msgpack maps take string keys only
    back = SamplingParams.from_dict(d)
    assert back == p and back.needs_logits_processing
    assert not SamplingParams().needs_logits_processing
