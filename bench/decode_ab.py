"""A/B of decode-step settings in one process, interleaved: the same running
requests, the settings alternating round by round, so the machine's drift
(other tenants, turbo) hits every setting alike.

Settings compared (``--compare``):

- ``fused``: the core's decoder stack on (``LlamaForCausalLM.fused_steps``)
  vs the Python layers, for steps where both apply;
- ``threshold``: ``kernels.cpu.DENSE_CORE_MAX_TOKENS`` values (which dense
  decode batches run on the core instead of torch's GEMM);
- ``spin``: the kernel threads' polling time for core-only steps
  (``model.runner.CORE_STEP_SPIN_US``), microseconds.

Prints the median step time of each setting per round and over all rounds.
Usage::

    .venv/bin/python bench/decode_ab.py --compare fused --batches 1,4,8 [--threads 2]
    .venv/bin/python bench/decode_ab.py --compare threshold --values 4,8,16 --batches 8,16
    .venv/bin/python bench/decode_ab.py --compare spin --values 0,30,100 --batches 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable


def setters(engine, compare: str, values: list[str]) -> dict[str, Callable[[], None]]:
    """Setting label -> a function that applies it to the running engine."""
    from paternoster.kernels import cpu
    from paternoster.model import runner as runner_module

    model = engine.runner.model
    if compare == "fused":
        return {"stack": lambda: setattr(model, "fused_steps", True),
                "python": lambda: setattr(model, "fused_steps", False)}
    if compare == "threshold":
        return {v: (lambda v=v: setattr(cpu, "DENSE_CORE_MAX_TOKENS", int(v))) for v in values}
    if compare == "spin":
        def spin(v: str) -> None:
            runner_module.CORE_STEP_SPIN_US = int(v)
            engine.runner._spin = -1  # re-apply on the next step
        return {v: (lambda v=v: spin(v)) for v in values}
    raise ValueError(f"--compare must be fused, threshold or spin, got {compare!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", required=True, choices=["fused", "threshold", "spin"])
    ap.add_argument("--values", default="", help="threshold/spin values, comma-separated")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="model dir or .gguf (default: embedded)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15, help="steps timed per setting and round")
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args()

    from paternoster import LLM
    from paternoster.bench.roofline import machine_info

    batches = [int(b) for b in args.batches.split(",")]
    kwargs = dict(dtype="bfloat16", num_threads=args.threads, max_model_len=4096,
                  max_num_seqs=max(batches))
    llm = LLM(args.model, **kwargs) if args.model else LLM(**kwargs)
    engine = llm.engine
    choices = setters(engine, args.compare, [v for v in args.values.split(",") if v])
    print(machine_info())
    run_ab(engine, choices, batches, args.rounds, args.steps, args.prompt_len,
           len(llm.tokenizer), args.compare)


def run_ab(engine, choices: dict[str, Callable[[], None]], batches: list[int], rounds: int,
           steps: int, prompt_len: int, vocab: int, name: str) -> dict[int, dict[str, float]]:
    """Interleaved A/B of ``choices`` on decode steps of each batch size.

    Args:
        engine: an :class:`~paternoster.engine.core.EngineCore`.
        choices: label -> a function applying that setting.
        rounds, steps: rounds of ``steps`` timed steps per setting (after one
            untimed warm-up round and one untimed step after each change).
        prompt_len, vocab: random prompts of this length over ``[3, vocab)``.
    Returns:
        batch -> label -> median step ms over the rounds (also printed).
    """
    from paternoster import SamplingParams
    from paternoster.engine.messages import EngineCoreRequest

    rng = random.Random(0)
    need = (rounds + 1) * len(choices) * (steps + 1) + 8
    params = SamplingParams(temperature=0.0, max_tokens=need, ignore_eos=True)
    results: dict[int, dict[str, float]] = {}
    for b in batches:
        ids = [f"ab{b}-{i}" for i in range(b)]
        for rid in ids:
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
            engine.add_request(EngineCoreRequest(rid, prompt, params))
        for _ in range(4):  # prefill and warm-up
            engine.step()
        medians: dict[str, list[float]] = {label: [] for label in choices}
        for apply in choices.values():  # a warm-up round, not timed
            apply()
            for _ in range(steps):
                engine.step()
        for _ in range(rounds):
            for label, apply in choices.items():
                apply()
                engine.step()  # the first step after a change is not timed
                times = []
                for _ in range(steps):
                    t = time.perf_counter()
                    engine.step()
                    times.append(time.perf_counter() - t)
                medians[label].append(1e3 * statistics.median(times))
        engine.abort_requests(ids)
        print(f"\nbatch {b} ({name}): median step ms per round, then overall")
        results[b] = {}
        for label, ms in medians.items():
            results[b][label] = statistics.median(ms)
            print(f"  {label:>8}: {' '.join(f'{m:6.2f}' for m in ms)}  | "
                  f"{statistics.median(ms):6.2f} ms = {1e3 * b / statistics.median(ms):6.1f} tok/s")
    return results

if __name__ == "__main__":
    main()
