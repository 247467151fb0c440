"""``LLM(model, tensor_parallel_size=2)``: this process is rank 0 and starts
one worker process; greedy ids equal TP=1's and HF transformers' ``generate``
on a tiny random Llama; a killed worker fails the next step at once, naming
it; ``shutdown`` leaves the gloo group so that another TP engine can start.

The suite sets PATERNOSTER_NUM_THREADS=1: one thread per rank."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from paternoster import LLM, SamplingParams
from tests.model.conftest import hf_generate

PROMPTS = [[5, 17, 33, 2, 90, 64, 7, 11, 3], [8, 1, 120, 44, 9, 70, 12, 33, 99, 4, 5, 6, 31],
           [3, 3, 3]]
N = 12
GREEDY = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
SIZES = dict(num_kv_blocks=64, block_size=8, dtype="float32")

pytestmark = pytest.mark.multiprocess


def _ids(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.fixture(scope="module")
def tp_llm(tiny_tp_model):
    llm = LLM(str(tiny_tp_model[0]), tensor_parallel_size=2, **SIZES)
    yield llm
    llm.shutdown()


def test_tp2_greedy_equals_tp1_and_hf_generate(tp_llm, tiny_tp_model):
    path, hf = tiny_tp_model
    got = _ids(tp_llm, PROMPTS)
    single = LLM(str(path), **SIZES)
    assert got == _ids(single, PROMPTS)
    assert got == [hf_generate(hf, p, N) for p in PROMPTS]
    assert tp_llm.engine.info["tensor_parallel_size"] == 2
    assert tp_llm.engine.threads.source == "tensor_parallel"
    [worker] = tp_llm.engine.runner.workers.procs
    assert worker.poll() is None
    # The KV cache holds this rank's share of the heads: 2 KV heads over 2 ranks.
    assert tp_llm.engine.runner.kv_caches[0][0].shape[2] == 1


def test_a_killed_worker_fails_the_next_step_at_once_naming_it(tp_llm):
    [worker] = tp_llm.engine.runner.workers.procs
    worker.kill()
    worker.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 \(pid \d+\) was killed by SIGKILL"):
        tp_llm.generate(PROMPTS[:1], GREEDY)
    assert time.monotonic() - start < 2.0
    tp_llm.shutdown()  # nothing to wait for: returns at once, and leaves the group
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"workers were stopped \(LLM.shutdown\(\)"):
        tp_llm.generate(PROMPTS[:1], GREEDY)


def test_a_model_tensor_parallel_does_not_split_is_refused_before_any_worker(tmp_path):
    import transformers

    from paternoster.config import EngineConfig, ModelConfig
    from paternoster.engine.core import EngineCore

    cfg = transformers.Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4,
                                      moe_intermediate_size=32)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.save_pretrained(tmp_path)  # config only: refused before the weights are read
    config = EngineConfig(ModelConfig(str(tmp_path)), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size=2: Qwen3MoeForCausalLM is not "
                                         "supported"):
        EngineCore(config)
    assert not dist.is_initialized()
