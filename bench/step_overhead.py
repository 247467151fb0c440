"""CPU work around the model per step: schedule + batch build + update, no forward pass.

DESIGN.md's step budget: <= 360 us per step with 256 running decodes at block
size 16 on this 2-core CPU. This runs the real ``EngineCore`` (scheduler, C++
KVCacheManager and BatchBuilder, update, output assembly) with the
simulator's cost-model runner in place of the model, and reports microseconds
per decode step: the whole ``EngineCore.step()`` minus the time inside the
runner (which here only evaluates the cost model and returns a fixed token).
Usage::

    .venv/bin/python bench/step_overhead.py [--num-seqs 256] [--prompt-len 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from paternoster.engine.core import EngineCore
from paternoster.engine.messages import EngineCoreRequest
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.cost_model import CostModel
from paternoster.simulate.runner import CostModelRunner, SimClock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--scheduler", default="fcfs")
    args = ap.parse_args()

    n, bs = args.num_seqs, args.block_size
    max_len = args.prompt_len + args.steps + 16
    num_blocks = n * (max_len // bs + 2)
    runner = CostModelRunner(CostModel.unit(), SimClock(), num_kv_blocks=num_blocks,
                             block_size=bs, max_model_len=max_len)  # fmt: skip
    config = EngineConfig(
        model=ModelConfig(model="cost-model", max_model_len=max_len),
        # Every prompt is the same: without caching each request computes its own.
        cache=CacheConfig(block_size=bs, num_kv_blocks=num_blocks, enable_prefix_caching=False),
        scheduler=SchedulerConfig(scheduler=args.scheduler, max_num_seqs=n,
                                  max_num_batched_tokens=n * args.prompt_len),
    )  # fmt: skip
    engine = EngineCore(config, runner, clock=time.perf_counter)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True)
    for i in range(n):
        prompt = list(range(3, 3 + args.prompt_len))
        engine.add_request(EngineCoreRequest(request_id=f"r{i}", prompt_token_ids=prompt,
                                             sampling_params=params))  # fmt: skip

    def step() -> float:
        """Seconds of one step outside the runner."""
        t = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t
        record = engine.step_log[-1]
        return wall - (record.duration - record.overhead)

    step()  # the prefill step
    times = [step() for _ in range(args.steps)]
    assert engine.scheduler.num_running == n
    us = [t * 1e6 for t in times]
    print(
        f"{n} running decodes, block size {bs}, scheduler {args.scheduler}: "
        f"median {statistics.median(us):.0f} us/step, mean {statistics.mean(us):.0f}, "
        f"p95 {sorted(us)[int(0.95 * len(us))]:.0f} (target <= 360 us)"
    )


if __name__ == "__main__":
    main()
