"""``LLM(model, data_parallel_size=2)``: two worker processes, each an
in-process engine on a core of its own; outputs equal one in-process engine's
(the reference: ``LLM(model)``, itself checked against HF ``generate`` in
test_llm_tensor_parallel.py) prompt by prompt, in the caller's order, with
per-prompt sampling params; a killed worker fails the next call at once,
naming it; a script without a ``__main__`` guard works and its workers exit
with it. The sharding rule is tested on made-up prompts.

The suite sets PATERNOSTER_NUM_THREADS=1: one thread per engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from paternoster import LLM, SamplingParams
from paternoster.entrypoints.llm_dp import prompt_weight, shard

N = 10
GREEDY = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True)
SIZES = dict(num_kv_blocks=128, block_size=8, dtype="float32", timeline_size=64)
SHARED = [7, 8, 9, 10, 11, 12, 13, 14, 15]  # a prefix of more than one block
PROMPTS = [[5, 17, 33, 2, 90, 64, 7, 11, 3], SHARED + [1, 2], [3, 3, 3],
           [8, 1, 120, 44, 9, 70, 12, 33, 99, 4, 5, 6, 31], SHARED + [40], [100, 2, 60, 9]]


def _prepared(ids: list[int], max_tokens: int = 4, n: int = 1):
    return (ids, None, SamplingParams(max_tokens=max_tokens, n=n), 0, None)


def _ids(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.fixture(scope="module")
def tiny_model(default_model_path, tmp_path_factory) -> str:
    """A tiny random Llama (sharp logits) with the default model's tokenizer
    and vocabulary: text prompts and its chat template run."""
    from transformers import AutoTokenizer

    from tests.model.tiny_checkpoints import tiny_checkpoint

    path = tmp_path_factory.mktemp("tiny-dp")
    vocab = len(AutoTokenizer.from_pretrained(str(default_model_path)))
    tiny_checkpoint("llama", path, sharp=True, tokenizer_from=default_model_path,
                    vocab_size=vocab)
    return str(path)


# ---------------------------------------------------------------- sharding


def test_shard_cuts_the_sorted_prompts_into_balanced_runs_in_the_callers_order():
    prompts = [_prepared([9, i], max_tokens=2 + i % 5) for i in range(9)]
    prompts += [_prepared([1, 2, 3, i]) for i in range(7)]
    shares = shard(prompts, 3)
    assert sorted(j for s in shares for j in s) == list(range(len(prompts)))
    assert all(s == sorted(s) for s in shares)  # the caller's order within an engine
    # Contiguous in token-id order: every engine's prompts sort before the next's.
    for a, b in zip(shares, shares[1:]):
        assert max(prompts[j][0] for j in a) < min(prompts[j][0] for j in b)
    weights = [sum(prompt_weight(prompts[j]) for j in s) for s in shares]
    heaviest = max(prompt_weight(p) for p in prompts)
    assert max(weights) - min(weights) <= heaviest
    # The prompts sharing [1, 2, 3] sort together: one engine, or two across a cut.
    assert len({e for e, s in enumerate(shares) for j in s if prompts[j][0][:3] == [1, 2, 3]}) <= 2


def test_shard_weighs_n_times_max_tokens_and_handles_few_prompts():
    heavy, light = _prepared([1], max_tokens=100, n=4), _prepared([2], max_tokens=1)
    assert prompt_weight(heavy) == 401
    assert shard([heavy, light, light, light], 2) == [[0], [1, 2, 3]]
    assert sorted(shard([light], 3)) == [[], [], [0]]  # one prompt: one engine
    assert [len(s) for s in shard([light, light], 3)] == [1, 0, 1]
    assert shard([], 2) == [[], []]
    with pytest.raises(ValueError, match="num_engines must be >= 1"):
        shard([light], 0)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_a_bad_data_parallel_size_is_refused(size):
    with pytest.raises(ValueError, match="data_parallel_size must be an integer >= 1"):
        LLM("/nonexistent", data_parallel_size=size)


def test_data_parallel_with_tensor_parallel_is_refused_naming_both(tiny_model):
    with pytest.raises(ValueError, match=r"data_parallel_size=2 with tensor_parallel_size=2"):
        LLM(tiny_model, data_parallel_size=2, tensor_parallel_size=2, **SIZES)


def test_engines_that_do_not_fit_on_the_cores_are_refused_before_any_worker(tiny_model):
    with pytest.raises(ValueError, match=r"needs 2048 physical cores"):
        LLM(tiny_model, data_parallel_size=2, num_threads=1024, **SIZES)


@pytest.mark.multiprocess
def test_an_engine_that_fails_to_build_fails_the_start_naming_it(tiny_model, tmp_path):
    import shutil
    from pathlib import Path

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_model) / name, tmp_path / name)  # no weights
    with pytest.raises(ValueError, match=r"data-parallel engine \d: "):
        LLM(str(tmp_path), data_parallel_size=2, **SIZES)


# ---------------------------------------------------------------- two engines

@pytest.fixture(scope="module")
def dp_llm(tiny_model):
    llm = LLM(tiny_model, data_parallel_size=2, **SIZES)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def single(tiny_model):
    return LLM(tiny_model, **SIZES)


@pytest.mark.multiprocess
def test_dp2_greedy_equals_one_engine_in_order_on_cores_of_their_own(dp_llm, single):
    texts = ["The capital of France is", "def fib(n):"]
    got, want = dp_llm.generate(PROMPTS + texts, GREEDY), single.generate(PROMPTS + texts, GREEDY)
    assert _ids(got) == _ids(want)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]
    assert [o.prompt for o in got] == [None] * len(PROMPTS) + texts
    assert [o.prompt_token_ids for o in got] == [o.prompt_token_ids for o in want]
    assert [o.request_id for o in got] == [str(i) for i in range(len(got))]
    assert all(o.finished for o in got)
    cpus = [set(info["cpus"]) for info in dp_llm.workers.info]
    assert cpus[0] and cpus[1] and not cpus[0] & cpus[1], cpus
    assert "data-parallel share" in dp_llm.workers.info[0]["threads"]
    assert dp_llm.engine is None and dp_llm.max_model_len == single.max_model_len
    # Both engines ran a share (each keeps its own request timeline).
    assert all(dp_llm.timeline(engine=i)["requests"] for i in range(2))


@pytest.mark.multiprocess
def test_each_prompt_keeps_its_own_sampling_params_and_priority(dp_llm, single):
    params = [SamplingParams(temperature=0, max_tokens=k + 1, ignore_eos=True)
              for k in range(len(PROMPTS))]
    params[2] = SamplingParams(temperature=0.8, seed=11, n=3, max_tokens=5, ignore_eos=True)
    params[4] = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[], logprobs=2,
                               ignore_eos=True)
    tenants = ["a", None, "b", "a", "c", None]
    got = dp_llm.generate(PROMPTS, params, priority=list(range(len(PROMPTS))), use_tqdm=True,
                          tenant=tenants)  # fmt: skip
    want = single.generate(PROMPTS, params)
    assert _ids(got) == _ids(want)
    assert [len(o.outputs[0].token_ids) for o in got] == [1, 2, 5, 4, 6, 6]
    assert len(got[2].outputs) == 3
    assert got[4].outputs[0].logprobs is not None


@pytest.mark.multiprocess
def test_chat_and_errors_match_one_engine(dp_llm, single):
    convs = [[{"role": "user", "content": f"Count to {k}."}] for k in range(3)]
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
    got = dp_llm.chat(convs, GREEDY, chat_template=template)
    assert _ids(got) == _ids(single.chat(convs, GREEDY, chat_template=template))
    assert got[1].prompt == "user: Count to 1.\nassistant:"
    for llm in (dp_llm, single):
        with pytest.raises(ValueError, match=r"prompt token id 99999 is out of range"):
            llm.generate([[1, 2], [99999]], GREEDY)
        with pytest.raises(ValueError, match="got 1 sampling params for 2 prompts"):
            llm.generate([[1], [2]], [GREEDY])
        with pytest.raises(ValueError, match="got 1 tenant values for 2 prompts"):
            llm.generate([[1], [2]], GREEDY, tenant=["x"])
    with pytest.raises(ValueError, match=r"engine must be in \[0, 2\)"):
        dp_llm.timeline(engine=2)
    assert dp_llm.generate([], GREEDY) == []
    assert _ids(dp_llm.generate(PROMPTS[:1], GREEDY)) == _ids(single.generate(PROMPTS[:1], GREEDY))


@pytest.mark.multiprocess
def test_an_engines_value_error_is_raised_and_cancels_the_other_share(dp_llm, single):
    bad = SamplingParams(max_tokens=4, structured_outputs={"json": {"type": "bogus"}})
    long = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
    prompts, params = [[3, 4, 5], [9, 9, 9, 9], [40, 41], [50, 51, 52], [60]], [long] * 4 + [bad]
    assert all(shard(dp_llm._prepare(prompts, [None] * 5, params, None, None), 2))  # both have work
    for llm in (single, dp_llm):
        with pytest.raises(ValueError, match='cannot compile the constraint.*type "bogus"'):
            llm.generate(prompts, params)
    # The engine without the bad prompt stopped its long ones early (aborted).
    cut = [r for i in range(2) for r in dp_llm.timeline(engine=i)["requests"]
           if r["finish_reason"] == "abort"]
    assert cut and all(r["num_output_tokens"] < 240 for r in cut)
    assert _ids(dp_llm.generate(PROMPTS, GREEDY)) == _ids(single.generate(PROMPTS, GREEDY))


@pytest.mark.multiprocess
def test_ctrl_c_cancels_every_engines_share(dp_llm, single):
    import _thread
    import threading

    long = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
    def number(r):  # a worker's own request numbers grow call by call
        return int(r["request_id"].split("-")[0])

    before = [max(map(number, dp_llm.timeline(engine=i)["requests"]), default=-1)
              for i in range(2)]
    # 40 long requests: the KV cache holds about 4 per engine at a time, so the call
    # runs in waves and lasts well past the interrupt even on a fast machine.
    prompts = [[3 + i, 4, 5 + i] for i in range(40)]
    # Ctrl-C, in this process only, every 0.3 s until one reaches this frame: on
    # a loaded machine one can fall into a finalizer run by the garbage
    # collector, where Python prints and drops it ("Exception ignored in ...").
    # Once one has arrived here the handler ignores the rest.
    arrived = threading.Event()

    def on_sigint(signum, frame):
        if not arrived.is_set():
            raise KeyboardInterrupt

    def ctrl_c() -> None:
        for _ in range(50):
            if arrived.wait(0.3):
                return
            _thread.interrupt_main()

    previous = signal.signal(signal.SIGINT, on_sigint)
    sender = threading.Thread(target=ctrl_c, daemon=True)
    sender.start()
    try:
        dp_llm.generate(prompts, long)
    except KeyboardInterrupt:
        arrived.set()
    else:
        pytest.fail("generate returned before any Ctrl-C reached it")
    finally:
        arrived.set()
        sender.join()
        signal.signal(signal.SIGINT, previous)
    assert _ids(dp_llm.generate(PROMPTS, GREEDY)) == _ids(single.generate(PROMPTS, GREEDY))
    for i in range(2):  # each engine stopped its share early (aborted), then ran the next call
        cut = [r for r in dp_llm.timeline(engine=i)["requests"]
               if number(r) > before[i] and r["finish_reason"] == "abort"]
        assert cut and all(r["num_output_tokens"] < 240 for r in cut), i


@pytest.mark.multiprocess
def test_a_killed_worker_fails_the_next_call_at_once_naming_it(dp_llm):
    worker = dp_llm.workers.procs[1]
    worker.kill()
    worker.wait()
    start = time.monotonic()
    match = rf"data-parallel engine 1 \(pid {worker.pid}\) was killed by SIGKILL"
    with pytest.raises(RuntimeError, match=match):
        dp_llm.generate(PROMPTS, GREEDY)
    assert time.monotonic() - start < 3.0
    with pytest.raises(RuntimeError, match=match):  # and every call after it
        dp_llm.generate(PROMPTS[:1], GREEDY)
    assert dp_llm.workers.procs[0].wait(5) is not None  # the other engine was stopped
    dp_llm.shutdown()


@pytest.mark.multiprocess
def test_a_worker_killed_mid_call_fails_that_call_at_once_naming_it(tiny_model, monkeypatch):
    llm = LLM(tiny_model, data_parallel_size=2, **SIZES)
    victim = llm.workers.procs[1]
    killed_at = []

    class KillOnFirstProgress:  # the progress bar: the first finished prompt kills engine 1
        def __init__(self, **kwargs):
            pass

        def update(self, k):
            if not killed_at:
                victim.kill()
                killed_at.append(time.monotonic())

        def close(self):
            pass

    monkeypatch.setattr("tqdm.tqdm", KillOnFirstProgress)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prompts = [[3, 4, 5], [9, 9, 9, 9], [40, 41], [50, 51, 52], [60]]
    try:
        with pytest.raises(RuntimeError, match=rf"data-parallel engine 1 \(pid {victim.pid}\) "
                                                "was killed by SIGKILL"):
            llm.generate(prompts, [short] + [long] * 4, use_tqdm=True)
        assert killed_at and time.monotonic() - killed_at[0] < 3.0
    finally:
        llm.shutdown()


SCRIPT = """
import json, os, sys
from paternoster import LLM, SamplingParams
llm = LLM(sys.argv[1], data_parallel_size=2, num_kv_blocks=64, block_size=8, dtype="float32")
outs = llm.generate([[5, 17, 33], [8, 1, 120, 44]], SamplingParams(temperature=0, max_tokens=4))
print(json.dumps({"ids": [o.outputs[0].token_ids for o in outs],
                  "pids": [p.pid for p in llm.workers.procs]}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


@pytest.mark.multiprocess
def test_a_script_without_a_main_guard_runs_and_its_workers_die_with_it(tiny_model, single):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT),
                             tiny_model], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    want = single.generate([[5, 17, 33], [8, 1, 120, 44]],
                           SamplingParams(temperature=0, max_tokens=4))
    assert line["ids"] == [o.outputs[0].token_ids for o in want]
    deadline = time.monotonic() + 5.0
    alive = line["pids"]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.1)
    assert not alive, f"workers {alive} outlived their parent"


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
