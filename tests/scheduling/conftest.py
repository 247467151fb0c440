"""Small worlds for scheduler tests: a real C++ KV cache manager, fake model outputs."""

from __future__ import annotations

import pytest

from paternoster import _core
from paternoster.config import SchedulerConfig
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.registry import load_scheduler_class


def create_scheduler(
    name: str = "fcfs",
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 64,
    caching: bool = False,
    **policy_config,
):
    kv = _core.KVCacheManager(num_blocks, block_size, enable_caching=caching)
    builder = _core.BatchBuilder(kv)
    config = SchedulerConfig(
        scheduler=name,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        policy_config=policy_config,
    )
    return load_scheduler_class(name)(config, kv, builder, max_model_len)


def create_requests(
    n: int, prompt_len: int = 5, max_tokens: int = 4, eos: int | None = None, **params
) -> list[Request]:
    return [
        Request(
            request_id=f"r{i}",
            prompt_token_ids=[(i * 31 + j) % 100 + 3 for j in range(prompt_len)],
            sampling_params=SamplingParams(max_tokens=max_tokens, **params),
            eos_token_id=eos,
            max_tokens=max_tokens,
        )
        for i in range(n)
    ]


def run_step(scheduler, token: int = 7):
    """One step with a fake model that samples ``token`` for every completing row."""
    plan = scheduler.schedule()
    sampled = {
        row: token
        for row, (r, n) in enumerate(zip(plan.scheduled, plan.num_scheduled_tokens))
        if r.num_computed_tokens + n == r.num_tokens
    }
    return plan, scheduler.update_from_output(plan, sampled)


@pytest.fixture
def make_scheduler():
    return create_scheduler
