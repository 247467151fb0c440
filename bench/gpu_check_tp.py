"""The tensor-parallel phase of ``bench/gpu_check.py``: TP=2 over NCCL, rank
r on GPU r (a machine with two GPUs), or over gloo on the CPU (``--dry-run``,
which runs the same code so that the checks themselves are tested here).

Three checks, from the smallest part to serving:

1. **layers**: each parallel layer of :mod:`paternoster.model.parallel`
   against the full torch layer (the same seeded full weights on both ranks).
2. **model**: a :class:`~paternoster.model.runner.ModelRunner` per rank over
   its shard of a tiny random Llama checkpoint: on GPUs its KV blocks come
   from memory profiling, agreed as the least over the ranks; a prefill of
   five sequences then greedy decode steps through the paged cache; rank 0's
   logits against HF transformers' float32 forward of the same weights over
   the generated sequences (relative L2 error per sequence, the bound of the
   single-GPU model check: 5e-2 in bfloat16, 1e-4 in float32 on the CPU).
3. **serving**: ``LLM(dir, tensor_parallel_size=2)`` (the engine's own
   worker process and group) against ``LLM(dir)`` on the same device, greedy
   with top-5 logprobs. On the CPU (float32) the ids must be equal. On GPUs
   (bfloat16, where the split changes the summation order) vLLM's
   ``check_logprobs_close`` rule applies: up to the first differing token
   the ids are equal, and at it each run's token is in the other's top 5.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch

#: Relative L2 error bound of the model check's logits per sequence.
MODEL_TOLERANCE = {"nccl": 5e-2, "gloo": 1e-4}
#: Absolute error bound of the layer check.
LAYER_TOLERANCE = {"nccl": 0.05, "gloo": 1e-4}
GEN_LEN = 16
TOP_LOGPROBS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, port: int, backend: str) -> tuple[torch.device, torch.dtype]:
    """Join the 2-rank group; this rank's device and the check's dtype."""
    import torch.distributed as dist

    cuda = backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    return device, torch.bfloat16 if cuda else torch.float32


def _leave() -> None:
    """Leave the group and end this rank's process at once: interpreter
    shutdown right after a collective can abort it (a gloo thread still
    holding the collective's tensors takes the GIL during finalization,
    pytorch/pytorch#190489; the check's dry run failed so one time in three)."""
    import torch.distributed as dist

    from paternoster.engine.pipe_worker import exit_without_finalizing

    dist.destroy_process_group()
    exit_without_finalizing(0)


def _layers_rank(rank: int, port: int, backend: str, out: str) -> None:
    """Rank ``rank`` of check 1; rank 0 writes the max errors to ``out``."""
    import torch.nn.functional as F

    from paternoster.model.parallel import (
        ColumnParallelLinear,
        ParallelLMHead,
        RowParallelLinear,
        TPGroup,
        VocabParallelEmbedding,
    )

    device, dtype = _join(rank, port, backend)
    tp = TPGroup.from_default()
    gen = torch.Generator().manual_seed(0)
    x, w1, w2 = (torch.randn(*s, generator=gen) / 8 for s in ((16, 256), (512, 256), (256, 512)))
    table = torch.randn(1001, 256, generator=gen)  # odd vocabulary: a padded shard
    ids = torch.randint(0, 1001, (16,), generator=gen)
    x, w1, w2, table = (t.to(device, dtype) for t in (x, w1, w2, table))
    ids = ids.to(device)
    part = ColumnParallelLinear.from_full(w1, None, tp)(x)
    errors = {
        "column (gathered)": ColumnParallelLinear.from_full(w1, None, tp, gather_output=True)(x)
        - F.linear(x, w1),
        "column -> row (one all-reduce)": RowParallelLinear.from_full(w2, None, tp)(part)
        - F.linear(F.linear(x, w1), w2),
        "vocab-parallel embedding": VocabParallelEmbedding.from_full(table, tp)(ids)
        - F.embedding(ids, table),
        "vocab-parallel LM head": ParallelLMHead.from_full(table, tp)(x)
        - F.linear(x, table).float(),
    }
    if rank == 0:
        Path(out).write_text(json.dumps({k: float(v.abs().max()) for k, v in errors.items()}))
    _leave()


def write_tiny_llama(path: Path, config: dict, dtype: torch.dtype) -> None:
    """A random Llama of ``config`` (HF names) saved to ``path`` in ``dtype``,
    with a word-level tokenizer over its vocabulary (``t0`` ... ``tV-1``; the
    serving check's ``LLM`` needs one, and nothing can be downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).to(dtype).save_pretrained(path)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(config["vocab_size"])},
                                       unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0",
                            eos_token="t1").save_pretrained(path)


def _model_rank(rank: int, port: int, backend: str, model_dir: str, out: str) -> None:
    """Rank ``rank`` of check 2; rank 0 writes the errors and both ranks' KV
    block counts to ``out``."""
    import torch.distributed as dist
    from gpu_check import greedy_steps, rel_errors

    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.parallel import TPGroup
    from paternoster.model.runner import ModelRunner

    device, dtype = _join(rank, port, backend)
    tp = TPGroup.from_default()
    bs, per_seq, cuda = 16, 32, backend == "nccl"
    runner = ModelRunner(
        ModelConfig(model=model_dir, dtype=str(dtype).removeprefix("torch."),
                    device="cuda" if cuda else "cpu", cuda_graphs=cuda),
        # GPUs: sized by profiling (and agreed over the ranks); CPU: given.
        CacheConfig(block_size=bs, num_kv_blocks=None if cuda else 8 * per_seq,
                    gpu_memory_utilization=0.2),
        max_num_seqs=8, max_num_batched_tokens=2048, tp=tp,
    )
    blocks = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(2)]
    dist.all_gather(blocks, torch.tensor([runner.num_kv_blocks], device=device))
    vocab = runner.hf_config.vocab_size
    g = torch.Generator().manual_seed(1)
    lens = [5, 60, 200, 17, 1]
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    logits = greedy_steps(runner.compute_logits, seqs, 8, bs, per_seq)
    if rank == 0:
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(model_dir).float().to(device).eval()
        errs = rel_errors(hf, seqs, lens, logits, device)
        Path(out).write_text(json.dumps({
            "rel_err_per_seq": errs, "num_kv_blocks": [int(b) for b in blocks],
            "graphs": runner.graphs is not None}))
    _leave()


def logprobs_close(a: list[tuple[list[int], list[list[int]]]],
                   b: list[tuple[list[int], list[list[int]]]]) -> tuple[bool, str]:
    """vLLM's ``check_logprobs_close`` rule over per-prompt ``(ids, top ids
    per position)`` of two runs: equal ids up to the first difference, where each token is in
    the other run's top logprobs; the rest of that sequence is not compared.
    Returns ``(ok, what)``."""
    diverged = 0
    for p, ((ids_a, lp_a), (ids_b, lp_b)) in enumerate(zip(a, b, strict=True)):
        for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)):
            if x == y:
                continue
            if x not in lp_b[i] or y not in lp_a[i]:
                return False, f"prompt {p} token {i}: {x} vs {y}, not in each other's top"
            diverged += 1
            break
    return True, f"{diverged} of {len(a)} diverged at a near-tie"


def _generate(llm, prompts: list[list[int]]) -> list[tuple[list[int], list[list[int]]]]:
    """Greedy ids and the top-5 ids at each position, per prompt."""
    from paternoster import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=GEN_LEN, ignore_eos=True,
                            logprobs=TOP_LOGPROBS)
    return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs.top_token_ids)
            for o in llm.generate(prompts, params)]


def check_serving(model_dir: str, backend: str, vocab_size: int) -> dict:
    """Check 3: ``LLM`` with ``tensor_parallel_size=2`` against ``LLM`` on
    one rank, same device and dtype. Returns the comparison."""
    from paternoster import LLM

    cuda = backend == "nccl"
    kwargs = dict(device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
                  num_kv_blocks=256, block_size=16)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, vocab_size, (n,), generator=g).tolist() for n in (7, 40, 130, 3)]
    single = LLM(model_dir, **kwargs)
    one = _generate(single, prompts)
    single.shutdown()
    del single
    split = LLM(model_dir, tensor_parallel_size=2, **kwargs)
    try:
        two = _generate(split, prompts)
    finally:
        split.shutdown()
    if cuda:
        ok, what = logprobs_close(two, one)
    else:
        ok = [ids for ids, _ in two] == [ids for ids, _ in one]
        what = "ids equal" if ok else "ids differ"
    return {"ok": ok, "what": what, "tp1": [i for i, _ in one], "tp2": [i for i, _ in two]}


def phase_tensor_parallel(report, backend: str, tiny_llama: dict) -> None:
    """The three TP=2 checks over ``backend`` (``nccl`` on two GPUs, ``gloo``
    on the CPU), rows added to ``report`` (a ``gpu_check.Report``); with fewer
    than two GPUs for nccl, one skip row says so.

    Args:
        tiny_llama: the HF config of the model checks' random Llama.
    """
    import torch.multiprocessing as mp
    from gpu_check import status

    if backend == "nccl" and torch.cuda.device_count() < 2:
        n = torch.cuda.device_count()
        print(f"[skip] tensor parallel TP=2 (NCCL): {n} GPU(s), needs 2", flush=True)
        report.row("tensor parallel TP=2 (nccl)", f"skipped: {n} GPU", "2 GPUs", "n/a")
        return
    dtype = torch.bfloat16 if backend == "nccl" else torch.float32
    with tempfile.TemporaryDirectory(prefix="pn-tp-check-") as tmp:
        out = os.path.join(tmp, "tp.json")
        mp.spawn(_layers_rank, args=(_free_port(), backend, out), nprocs=2, join=True)
        layers = json.loads(Path(out).read_text())
        model_dir = os.path.join(tmp, "tiny-llama")
        write_tiny_llama(Path(model_dir), tiny_llama, dtype)
        mp.spawn(_model_rank, args=(_free_port(), backend, model_dir, out), nprocs=2,
                 join=True)
        model = json.loads(Path(out).read_text())
        serving = check_serving(model_dir, backend, tiny_llama["vocab_size"])
    report.data[f"tensor_parallel_{backend}"] = {"layers": layers, "model": model,
                                                 "serving": serving}
    tol = LAYER_TOLERANCE[backend]
    for name, err in layers.items():
        report.row(f"TP=2 {backend}: {name}", f"max |err| {err:.2e}", f"<= {tol:g}",
                   status(err <= tol))
    worst, tol = max(model["rel_err_per_seq"]), MODEL_TOLERANCE[backend]
    agreed = len(set(model["num_kv_blocks"])) == 1
    report.row(f"TP=2 {backend}: model logits vs HF fp32", f"rel L2 {worst:.2e}, KV blocks "
               f"{model['num_kv_blocks']}", f"< {tol:g}, blocks equal",
               status(worst < tol and agreed))
    report.row(f"TP=2 {backend}: LLM greedy vs TP=1", serving["what"],
               "top-5 close" if backend == "nccl" else "ids equal", status(serving["ok"]))
    print(f"[tp] {backend}: layers {layers}; model {model}; serving {serving['what']}",
          flush=True)
