"""EngineCore against a scripted Runner: what it hands the runner each step
(rows that sample, logits rows, prompt chunks) and what it does with the
runner's tokens, logprobs and prompt logprobs."""

from __future__ import annotations

import numpy as np

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.logprobs import Logprobs
from paternoster.model.interface import ModelInput, ModelRunnerOutput
from paternoster.sampling_params import SamplingParams

from .conftest import make_request


class ScriptedRunner:
    """Samples token ``100 + row``; token logprobs ``-row``; prompt logprobs
    ``-(position + 1)`` for the token at prompt position ``position + 1``."""

    num_kv_blocks = 32
    block_size = 4
    max_model_len = 64
    vocab_size = 200
    eos_token_id = None

    def __init__(self) -> None:
        self.inputs: list[ModelInput] = []

    def execute_model(self, model_input: ModelInput) -> ModelRunnerOutput:
        self.inputs.append(model_input)
        rows = model_input.sample_rows.tolist()
        out = ModelRunnerOutput({row: 100 + row for row in rows})
        for row in rows:
            r = model_input.requests[row]
            if r.sampling_params.logprobs is not None:
                out.logprobs[r.request_id] = Logprobs([-float(row)], [[]], [[]])
        for c in model_input.prompt_chunks:
            positions = range(c.first, c.first + c.count)
            out.prompt_logprobs[c.request.request_id] = Logprobs(
                [-(p + 1.0) for p in positions], [[] for _ in positions], [[] for _ in positions])
        return out


def make_engine() -> tuple[EngineCore, ScriptedRunner]:
    runner = ScriptedRunner()
    config = EngineConfig(
        model=ModelConfig(model="scripted"),
        cache=CacheConfig(block_size=4, num_kv_blocks=32),
        scheduler=SchedulerConfig(scheduler="chunked_prefill", max_num_seqs=4,
                                  max_num_batched_tokens=8),
    )  # fmt: skip
    return EngineCore(config, runner), runner


def test_rows_logits_indices_and_prompt_chunks_handed_to_the_runner():
    """Budget 8: step 1 runs a's whole 5-token prompt and b's first 3 of 9
    tokens; step 2 a's decode and b's last 6. Logits rows: the samplers' last
    tokens first, then b's prompt positions (up to position 7: position 8's
    logit is b's first sample)."""
    engine, runner = make_engine()
    engine.add_request(make_request("a", [5] * 5, SamplingParams(max_tokens=4, logprobs=0)))
    engine.add_request(make_request("b", list(range(10, 19)),
                                    SamplingParams(max_tokens=4, prompt_logprobs=1)))
    first = engine.step()
    second = engine.step()
    one, two = runner.inputs
    assert [r.request_id for r in one.requests] == ["a", "b"]
    assert one.num_scheduled_tokens.tolist() == [5, 3]
    assert one.sample_rows.tolist() == [0]
    assert one.arrays["logits_indices"].tolist() == [4, 5, 6, 7]
    assert [(c.request.request_id, c.first, c.count) for c in one.prompt_chunks] == [("b", 0, 3)]
    assert [r.request_id for r in two.requests] == ["a", "b"]
    assert two.num_computed_tokens.tolist() == [5, 3]
    assert two.num_scheduled_tokens.tolist() == [1, 6]
    assert two.sample_rows.tolist() == [0, 1]
    assert two.arrays["logits_indices"].tolist() == [0, 6, 1, 2, 3, 4, 5]
    assert [(c.request.request_id, c.first, c.count) for c in two.prompt_chunks] == [("b", 3, 5)]
    # The runner's tokens and logprobs reach the outputs; b's prompt logprobs
    # (both chunks, prompt tokens 1..8) come with its first token only.
    assert [(o.request_id, o.new_token_ids) for o in first] == [("a", [100])]
    assert first[0].logprobs.token_logprobs == [0.0] and first[0].prompt_logprobs is None
    got = {o.request_id: o for o in second}
    assert got["a"].new_token_ids == [100] and got["b"].new_token_ids == [101]
    assert got["b"].logprobs is None
    assert got["b"].prompt_logprobs.token_logprobs == [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0,
                                                       -8.0]
    third = {o.request_id: o for o in engine.step()}
    assert third["b"].prompt_logprobs is None
    assert not runner.inputs[2].prompt_chunks


def test_no_prompt_chunks_and_no_extra_logits_rows_when_none_asked():
    engine, runner = make_engine()
    for i in range(3):
        engine.add_request(make_request(f"r{i}", [7] * (2 + i), SamplingParams(max_tokens=2)))
    while engine.has_unfinished_requests():
        engine.step()
    for step in runner.inputs:
        assert step.prompt_chunks == []
        assert len(step.arrays["logits_indices"]) == len(step.sample_rows)
        qsl = step.arrays["query_start_loc"]
        np.testing.assert_array_equal(step.arrays["logits_indices"], qsl[1:][step.sample_rows] - 1)
