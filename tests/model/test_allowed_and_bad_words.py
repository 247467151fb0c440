"""allowed_token_ids and bad_words (vLLM's sampling fields) on the logits,
against numpy written from vLLM's definition, and bad_words' token sequences
against the tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paternoster.model.logits_processors import apply_logits_processors
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams, request_fields

VOCAB = 200


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path))


def _request(output: list[int], **params) -> Request:
    r = Request("r", [1, 2, 3], SamplingParams(**params), eos_token_id=0)
    r.output_token_ids = list(output)
    return r


def _logits(n: int) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(3)) * 4


def test_allowed_token_ids_leave_only_their_logits():
    logits = _logits(2)
    allowed = [5, 17, 199]
    reqs = [_request([], allowed_token_ids=allowed), _request([])]
    got = logits.clone()
    apply_logits_processors(got, reqs)
    want = np.full(VOCAB, -np.inf, dtype=np.float32)
    want[allowed] = logits[0, allowed].numpy()
    np.testing.assert_array_equal(got[0].numpy(), want)
    assert torch.equal(got[1], logits[1])  # a row that asked for nothing is untouched


def test_bad_word_last_token_is_banned_only_after_its_prefix():
    seq = [40, 41, 42]
    logits = _logits(3)
    reqs = [
        _request([9, 40, 41], bad_words=["x"], bad_words_token_ids=[seq, [77]]),
        _request([9, 40], bad_words=["x"], bad_words_token_ids=[seq]),  # prefix incomplete
        _request([], bad_words=["x"], bad_words_token_ids=[[77]]),  # one token: always
    ]
    got = logits.clone()
    apply_logits_processors(got, reqs)
    assert got[0, 42] == -np.inf and got[0, 77] == -np.inf
    assert torch.equal(got[1], logits[1])
    assert got[2, 77] == -np.inf
    changed = (got != logits).sum(dim=1).tolist()
    assert changed == [2, 0, 1]


def test_bad_words_become_their_token_sequences(tokenizer):
    params = SamplingParams(bad_words=["Paris", "New York"]).prepare(tokenizer)
    seqs = params.bad_words_token_ids
    for word in ("Paris", "New York"):
        assert tokenizer.encode(word, add_special_tokens=False) in seqs
    spaced = tokenizer.encode(" Paris", add_special_tokens=False)
    assert spaced in seqs  # " Paris" is another single token
    assert params.needs_logits_processing


def test_derived_field_is_not_a_request_field():
    assert "bad_words" in request_fields() and "allowed_token_ids" in request_fields()
    assert "bad_words_token_ids" not in request_fields()


@pytest.mark.parametrize(("kw", "match"), [
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
])  # fmt: skip
def test_bad_values_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_allowed_token_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="allowed_token_ids must be token ids in"):
        SamplingParams(allowed_token_ids=[3, VOCAB]).check_token_ids(VOCAB)


@pytest.mark.parametrize("kw", [
    {"allowed_token_ids": [2], "min_tokens": 1},  # 2 is the EOS held back
    {"allowed_token_ids": [42], "bad_words": ["x"], "bad_words_token_ids": [[42]]},
    {"allowed_token_ids": [42], "stop_token_ids": [42], "min_tokens": 3},
])  # fmt: skip
def test_masks_that_leave_no_token_fall_back_to_the_allowed_ones(kw):
    """A fully masked row would sample outside the vocabulary (and crash the
    engine): the allowed tokens keep their raw logits instead."""
    logits = _logits(1)
    req = _request([], **kw)
    req.eos_token_id = 2
    got = logits.clone()
    apply_logits_processors(got, [req])
    allowed = kw["allowed_token_ids"]
    assert torch.equal(got[0, allowed], logits[0, allowed])
    assert torch.isneginf(got[0]).sum() == VOCAB - len(allowed)
