"""CPU work around the model per step: schedule + batch build + update, no forward pass.

DESIGN.md's step budget: <= 360 us per step with 256 running decodes at block
size 16 on this 2-core CPU. This drives the real Scheduler (FCFS), the C++
KVCacheManager and BatchBuilder with a fake model that samples a fixed token,
and reports microseconds per decode step. Usage::

    .venv/bin/python bench/step_overhead.py [--num-seqs 256] [--prompt-len 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from paternoster import _core
from paternoster.config import SchedulerConfig
from paternoster.request import Request
from paternoster.sampling_params import SamplingParams
from paternoster.scheduling.registry import load_scheduler_class


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
    kv = _core.KVCacheManager(num_blocks, bs)
    builder = _core.BatchBuilder(kv)
    config = SchedulerConfig(
        scheduler=args.scheduler, max_num_seqs=n, max_num_batched_tokens=n * args.prompt_len
    )
    sched = load_scheduler_class(args.scheduler)(config, kv, builder, max_len)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True)
    for i in range(n):
        prompt = list(range(3, 3 + args.prompt_len))
        sched.add_request(Request(f"r{i}", prompt, params, max_tokens=args.steps + 8))

    def step() -> float:
        t = time.perf_counter()
        plan = sched.schedule()
        ids, computed, scheduled = plan.batch_arrays()
        batch = builder.build(ids, computed, scheduled)
        num_tokens = np.fromiter((r.num_tokens for r in plan.scheduled), np.int64, len(ids))
        rows = np.nonzero(computed.astype(np.int64) + scheduled == num_tokens)[0]
        batch["logits_indices"] = batch["logits_indices"][rows]
        sched.update_from_output(plan, dict.fromkeys(rows.tolist(), 7))
        return time.perf_counter() - t

    step()  # the prefill step
    times = [step() for _ in range(args.steps)]
    assert sched.num_running == n
    us = [t * 1e6 for t in times]
    print(
        f"{n} running decodes, block size {bs}, scheduler {args.scheduler}: "
        f"median {statistics.median(us):.0f} us/step, mean {statistics.mean(us):.0f}, "
        f"p95 {sorted(us)[int(0.95 * len(us))]:.0f} (target <= 360 us)"
    )


if __name__ == "__main__":
    main()
