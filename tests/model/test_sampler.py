"""Sampler behaviour: greedy, filters, seeded reproducibility, and the sampled
distribution against an independent numpy computation of the target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paternoster.model.interface import ModelInput, PromptChunk
from paternoster.model.sampler import Sampler
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams

# chi-square critical values at p = 0.001 (df -> value), from standard tables.
CHI2_999 = {4: 18.47, 9: 27.88}


def _logits(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(logits, params, generators=None):
    if isinstance(params, SamplingParams):
        params = [params] * logits.shape[0]
    return Sampler().sample(logits, params, generators or [None] * logits.shape[0])


def _target(logits: np.ndarray, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0) -> np.ndarray:
    """The filtered, renormalised distribution, computed independently in float64."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros_like(p, dtype=bool)
    keep[order[: top_k if top_k > 0 else len(p)]] = True
    q = np.where(keep, p, 0)
    q /= q.sum()
    mass = 0.0
    for i in order:  # smallest prefix reaching top_p
        if mass >= top_p:
            keep[i] = False
        mass += q[i]
    q = np.where(keep, q, 0)
    q = np.where(q >= min_p * q.max(), q, 0)
    return q / q.sum()


def _chi2(tokens: torch.Tensor, target: np.ndarray) -> tuple[float, int]:
    counts = np.bincount(tokens.numpy(), minlength=len(target))
    assert counts[target == 0].sum() == 0, "sampled a token with zero target probability"
    support = target > 0
    expected = target[support] * len(tokens)
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def test_greedy_is_argmax():
    logits = _logits(16, 500)
    tokens = _sample(logits, SamplingParams(temperature=0.0))
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(-1))


def test_top_k_one_is_greedy():
    logits = _logits(16, 500, seed=1)
    torch.manual_seed(0)
    assert torch.equal(_sample(logits, SamplingParams(temperature=1.5, top_k=1)),
                       logits.argmax(-1))


def test_greedy_and_random_rows_mix():
    logits = _logits(6, 300, seed=2)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)] * 3
    tokens = _sample(logits, params)
    assert torch.equal(tokens[0::2], logits[0::2].argmax(-1))


@pytest.mark.parametrize("seeded", [
    SamplingParams(temperature=1.0, top_p=0.9, seed=1234),  # full-vocabulary path
    SamplingParams(temperature=1.0, top_k=20, top_p=0.8, min_p=0.01, seed=1234),  # candidates
])
def test_seeded_row_is_independent_of_batch_composition(seeded):
    vocab, steps = 1000, 12
    row = _logits(steps, vocab, seed=3) / 2

    def run(batch_size: int, where: int) -> list[int]:
        gen = torch.Generator().manual_seed(1234)
        others = [torch.Generator().manual_seed(99 + i) for i in range(batch_size)]
        out = []
        for s in range(steps):
            logits = _logits(batch_size, vocab, seed=100 + s)
            logits[where] = row[s]
            params = [SamplingParams(temperature=0.8, top_k=50, min_p=0.05),
                      SamplingParams(temperature=1.2, top_p=0.7)] * batch_size
            params = params[:batch_size]
            params[where] = seeded
            gens = [others[i] if i % 2 else None for i in range(batch_size)]
            gens[where] = gen
            out.append(int(_sample(logits, params, gens)[where]))
        return out

    alone = run(1, 0)
    assert run(5, 2) == alone
    assert run(9, 8) == alone
    assert len(set(alone)) > 1  # actually random


def test_top_p_and_min_p_never_pick_excluded_tokens():
    base = _logits(1, 64, seed=4)[0] / 3
    n = 4000
    for kwargs in ({"top_p": 0.5}, {"min_p": 0.2}, {"top_k": 5, "top_p": 0.8},
                   {"top_p": 0.9, "min_p": 0.1, "temperature": 0.7}):
        target = _target(base.numpy(), **kwargs)
        torch.manual_seed(0)
        tokens = _sample(base.expand(n, -1).clone(), SamplingParams(**kwargs))
        allowed = set(np.flatnonzero(target).tolist())
        assert 1 < len(allowed) < 64, kwargs
        assert set(tokens.tolist()) <= allowed, kwargs
        assert len(set(tokens.tolist())) > 1, kwargs


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 5}, {"temperature": 1.0, "top_p": 0.8},
     {"temperature": 1.0, "min_p": 0.1}],
)
def test_empirical_distribution_matches_target(kwargs):
    """40k draws over a 10-token vocabulary; chi-square below the p=0.001 critical value."""
    base = torch.tensor([2.0, 1.5, 1.0, 0.8, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0])
    target = _target(base.numpy(), **kwargs)
    torch.manual_seed(1)
    tokens = _sample(base.expand(40_000, -1).clone(), SamplingParams(**kwargs))
    stat, df = _chi2(tokens, target)
    assert stat < CHI2_999.get(df, 2 * df + 10), (stat, df)


@pytest.mark.parametrize("kwargs", [
    {"top_k": 300, "top_p": 0.95, "temperature": 0.9},  # full-vocabulary path with top-k
    {"top_k": 200, "top_p": 0.95, "temperature": 0.9, "min_p": 0.02},  # top-k candidates
    {"top_p": 0.95, "temperature": 0.9},  # nucleus candidates
    {"top_p": 0.9, "temperature": 4.0},  # nucleus wider than 256 tokens: full path
])
def test_large_vocabulary_filters_match_target(kwargs):
    """1000-token vocabulary with a few dominant tokens: both sampling paths give the
    target distribution (chi-square over the kept tokens)."""
    shuffle = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    base = -1.0 - torch.linspace(0, 4, 1000)[shuffle]  # no ties
    base[[17, 400, 999, 3, 250]] = torch.tensor([4.0, 3.6, 3.1, 2.4, 2.0])
    target = _target(base.numpy(), **kwargs)
    torch.manual_seed(2)
    tokens = _sample(base.expand(30_000, -1).clone(), SamplingParams(**kwargs))
    stat, df = _chi2(tokens, target)
    assert 3 <= df < 1000
    if kwargs["temperature"] == 4.0:
        assert df > 256
    # Wilson-Hilferty approximation of the chi-square 0.999 quantile (z = 3.09).
    crit = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    assert stat < crit, (stat, df, crit)


def test_seeded_rows_follow_the_distribution():
    """Each of 5000 rows has its own generator; together they still sample the target."""
    base = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    target = _target(base.numpy())
    n = 5000
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens = _sample(base.expand(n, -1).clone(), SamplingParams(temperature=1.0, seed=0), gens)
    stat, df = _chi2(tokens, target)
    assert stat < CHI2_999[df], stat


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="params"):
        Sampler().sample(_logits(3, 10), [SamplingParams()] * 2, [None] * 3)


def test_input_logits_not_modified():
    logits = _logits(4, 100, seed=5)
    before = logits.clone()
    _sample(logits, SamplingParams(temperature=0.5, top_p=0.5, min_p=0.1))
    assert torch.equal(logits, before)


# ---------------------------------------------------------------- sample_step


def _step_input(requests, sample_rows, chunks=()) -> ModelInput:
    """A ModelInput with only what the sampling stage reads filled in."""
    n = len(requests)
    return ModelInput(
        requests=list(requests), preempted=[], arrays={},
        num_computed_tokens=np.zeros(n, np.int32), num_scheduled_tokens=np.ones(n, np.int32),
        sample_rows=np.asarray(sample_rows, np.int64), prompt_chunks=list(chunks),
    )  # fmt: skip


def test_sample_step_keys_tokens_by_row_and_keeps_raw_logprobs():
    """Rows 0 and 2 sample (row 1 is mid-prefill): tokens are keyed by row; the
    logprobs are log_softmax of the logits before logit_bias changed the pick."""
    logits = _logits(2, 50, seed=4)
    raw = torch.log_softmax(logits, dim=-1)
    banned = int(logits[1].argmax())
    reqs = [
        Request("a", [3, 4], SamplingParams(temperature=0.0, logprobs=2)),
        Request("b", [5], SamplingParams()),
        Request("c", [6, 7], SamplingParams(temperature=0.0, logprobs=0,
                                            logit_bias={banned: -100.0})),
    ]  # fmt: skip
    out = Sampler().sample_step(logits.clone(), _step_input(reqs, [0, 2]))
    second = int(logits[1].topk(2).indices[1])
    assert out.sampled_token_ids == {0: int(logits[0].argmax()), 2: second}
    assert out.prompt_logprobs == {}
    a, c = out.logprobs["a"], out.logprobs["c"]
    assert set(out.logprobs) == {"a", "c"}
    assert a.token_logprobs == pytest.approx([float(raw[0].max())], abs=1e-6)
    assert a.top_token_ids == [raw[0].topk(2).indices.tolist()]
    assert c.token_logprobs == pytest.approx([float(raw[1, second])], abs=1e-6)
    assert c.top_token_ids == [[]]


def test_sample_step_scores_prompt_chunks_after_the_sampling_rows():
    """Logits rows: one sampling row, then a 3-position chunk of request "p"
    starting at prompt position 2: they score prompt tokens 3, 4 and 5."""
    logits = _logits(4, 30, seed=5)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    reqs = [Request("s", [1, 2], SamplingParams(temperature=0.0)),
            Request("p", prompt, SamplingParams(prompt_logprobs=1))]  # fmt: skip
    out = Sampler().sample_step(logits.clone(), _step_input(
        reqs, [0], [PromptChunk(reqs[1], first=2, count=3)]))  # fmt: skip
    assert out.sampled_token_ids == {0: int(logits[0].argmax())}
    scored = out.prompt_logprobs["p"]
    want = torch.log_softmax(logits[1:], dim=-1)
    targets = prompt[3:6]
    assert scored.token_logprobs == pytest.approx(
        [float(want[i, t]) for i, t in enumerate(targets)], abs=1e-6)
    assert scored.top_token_ids == [[int(want[i].argmax())] for i in range(3)]


def test_sample_step_refuses_too_few_logits_rows():
    reqs = [Request("a", [1], SamplingParams()), Request("b", [1, 2, 3], SamplingParams())]
    chunk = PromptChunk(reqs[1], first=0, count=2)
    with pytest.raises(ValueError, match="need 3 logits rows"):
        Sampler().sample_step(_logits(2, 10), _step_input(reqs, [0], [chunk]))
