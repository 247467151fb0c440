"""torch's intra-op threads are off (1) while a CPU step whose matrix
multiplies all run in the core executes, and restored after it."""

from __future__ import annotations

import pytest
import torch

from paternoster.config import CacheConfig, ModelConfig
from paternoster.model.runner import ModelRunner
from paternoster.model.torch_threads import torch_threads_off

from .conftest import BatchMaker, Chunk
from .tiny_checkpoints import tiny_checkpoint


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_context_sets_one_thread_and_restores_even_on_error(two_threads):
    with torch_threads_off(True):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with torch_threads_off(False):
        assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), torch_threads_off(True):
        raise RuntimeError("step failed")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_core_only_steps_run_with_torch_threads_off(tmp_path, two_threads, batch_invariant):
    """Batch-invariant mode puts every matmul in the core (threads off); the
    default mode's 40-token float32 step uses torch's GEMM above the core's
    dense-token limit only where that limit is below 40, so the expectation
    follows the model's own core_only_step."""
    path = tmp_path / "llama"
    tiny_checkpoint("llama", path)
    runner = ModelRunner(ModelConfig(model=str(path), dtype="float32",
                                     batch_invariant=batch_invariant),
                         CacheConfig(block_size=8, num_kv_blocks=32))
    seen = []
    forward = runner.model.forward

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    runner.model.forward = recording
    tokens = list(range(3, 43))  # within the tiny vocabulary (131)
    maker = BatchMaker(runner.num_kv_blocks, 8)
    runner.compute_logits(maker.batch([Chunk("a", tokens, 0, 40)]))
    expected = 1 if runner.model.core_only_step(40) else 2
    assert batch_invariant is False or expected == 1
    assert seen == [expected] and torch.get_num_threads() == 2
