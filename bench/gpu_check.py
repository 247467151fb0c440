"""One prepared GPU check of Paternoster's CUDA path (issue 3), for a machine
with one NVIDIA GPU: build, kernel correctness, kernel bandwidth, end-to-end
decode throughput against the bandwidth roofline and against HF transformers.

Phases (each with a time budget; a phase that no longer fits is skipped with a
message, the whole run stays inside ``--budget`` seconds, default 8 minutes):

1. build: ``pip install --no-build-isolation --no-deps -e .`` with
   ``CMAKE_CUDA_ARCHITECTURES`` set to this GPU's, then re-run this script in a
   fresh interpreter (the editable install's import hook loads at start-up).
2. correctness: every kernel case of :data:`CASES` against a float32 torch
   reference on fresh random inputs (seed recorded): output and unused KV cache
   slots poisoned with NaN first; ``||out - ref|| / ||ref||`` below
   :data:`TOLERANCE` (bf16 1e-2, fp16 5e-3: output rounding is 2^-9 / 2^-11
   relative, everything else is fp32), every output row finite and non-zero;
   plus reshape_and_cache, zero padding rows and a CUDA-graph replay.
3. kernel bandwidth: the decode kernel at 64 sequences x 2048 context, bf16,
   32 query / 8 KV heads, D=128, block 16, timed with CUDA events; its
   effective bandwidth (bytes of K/V + Q + out / time) against the measured
   device-to-device copy bandwidth (2 x bytes / time of a 1 GiB copy).
   Target >= 80 %.
4. end-to-end decode: an EngineCore over a Llama-3-8B-shaped model (random bf16
   weights, ``--load-format dummy``; the config is built here, nothing is
   downloaded) with CUDA graphs, batches of 1, 64 and 256 requests of
   ``--prompt-len`` tokens generating ``--gen-len`` tokens each. The median
   decode step time against the roofline (weight bytes + KV bytes read per step
   at the measured copy bandwidth). Target >= 70 % at 256.
5. peer: the same workload through HF transformers' continuous batching
   ``generate_batch`` (static ``generate`` if absent). Target: Paternoster >= 3x
   its output tokens per second at 256.
6. tensor parallel (:mod:`gpu_check_tp`), where torch sees two GPUs: TP=2
   over NCCL, layer by layer, the split model's logits against HF's float32
   forward, and ``LLM(tensor_parallel_size=2)`` against one GPU; a one-GPU
   machine prints a skip row. ``--dry-run`` runs it over gloo on the CPU.

Prints one table last and writes ``gpu_check.json`` under ``$OUT`` (or
``--out``). Imports only torch, numpy, transformers and the engine core (no
HTTP or ZMQ modules). ``--dry-run`` runs on a CPU as far as it can: argument
parsing, the model config and roofline arithmetic, and phase 2 (correctness)
whole except the graph replay, on the CPU emulation of the CUDA kernels
(``paternoster._cuda_emu``: cuda/src compiled against cuda/emu, about a
minute); the timing rows read n/a. It exits 1 when a check fails.

Usage::

    bench/gpu_check.sh                 # on the GPU machine
    python bench/gpu_check.py --dry-run
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 1e-4}
FORBIDDEN_MODULES = ("zmq", "fastapi", "uvicorn", "starlette")

# Llama-3-8B's shapes (meta-llama/Meta-Llama-3-8B config.json), built here.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    "initializer_range": 0.02, "attention_bias": False, "mlp_bias": False,
}  # fmt: skip

# Phase budgets in seconds (upper bounds; a phase is skipped when less is left).
PHASE_BUDGET = {"build": 240, "correctness": 60, "kernel": 30, "e2e": 150, "peer": 120,
                "tp": 90}


# --------------------------------------------------------------------------- plumbing


class Clock:
    """Wall-clock budget of the whole run (``deadline`` is a time.time() value)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def left(self) -> float:
        """Seconds left."""
        return self.deadline - time.time()

    def allows(self, phase: str, need: float | None = None) -> bool:
        """Whether ``need`` seconds (default half the phase's budget) are left;
        prints the skip message when not."""
        need = PHASE_BUDGET[phase] * 0.5 if need is None else need
        if self.left() < need:
            print(f"[skip] {phase}: {self.left():.0f} s left, needs ~{need:.0f} s", flush=True)
            return False
        return True


@dataclass
class Report:
    """Rows of the final table plus everything for the JSON file."""

    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def row(self, check: str, measured: str, target: str, status: str) -> None:
        """Append a table row."""
        self.rows.append((check, measured, target, status))

    def print_table(self) -> None:
        """The table, last thing printed."""
        head = ("check", "measured", "target", "status")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(4)]
        line = "  ".join("-" * w for w in widths)
        print("\n" + line)
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        print(line)
        for r in self.rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        print(line, flush=True)

    def write(self, out_dir: Path) -> Path:
        """Write ``out_dir/gpu_check.json`` (the data plus the table)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "gpu_check.json"
        self.data["table"] = [dict(zip(("check", "measured", "target", "status"), r))
                              for r in self.rows]
        path.write_text(json.dumps(self.data, indent=2, default=str))
        return path


def status(ok: bool | None) -> str:
    """PASS / FAIL / n/a."""
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


# --------------------------------------------------------------------------- kernel cases


@dataclass(frozen=True)
class Case:
    """One paged-attention correctness case (q_len 0 = sequence without new tokens)."""

    name: str
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    q_lens: tuple[int, ...]
    ctx_lens: tuple[int, ...]  # cached tokens before this step's
    sliding_window: int = 0  # W > 0: each query sees its last W positions
    sinks: bool = False  # per-head attention-sink logits (gpt-oss)


CASES = (
    Case("decode gqa4 d128 bs16", torch.bfloat16, 32, 8, 128, 16, (1,) * 8,
         (1, 15, 16, 17, 511, 512, 513, 2999)),
    Case("decode gqa3 d64 bs32", torch.bfloat16, 9, 3, 64, 32, (1,) * 6,
         (0, 30, 31, 32, 700, 1500)),
    Case("decode split-K long ctx", torch.bfloat16, 32, 8, 128, 16, (1, 1), (40000, 5000)),
    Case("decode fp16 d128 bs32", torch.float16, 32, 8, 128, 32, (1,) * 5, (3, 100, 1000, 129, 64)),
    Case("decode mha d64", torch.bfloat16, 8, 8, 64, 16, (1,) * 4, (5, 200, 1025, 4000)),
    Case("decode gqa2 d64", torch.bfloat16, 4, 2, 64, 16, (1,) * 3, (9, 300, 2500)),
    Case("decode gqa8 d128", torch.bfloat16, 64, 8, 128, 16, (1,) * 3, (77, 1000, 3000)),
    Case("decode gqa16 (2 head chunks)", torch.bfloat16, 16, 1, 128, 16, (1,) * 3, (1, 600, 2100)),
    Case("prefill chunks gqa4 d128 bs16", torch.bfloat16, 32, 8, 128, 16, (37, 300, 64, 5),
         (0, 513, 2000, 17)),
    Case("prefill gqa3 d64 bs32", torch.bfloat16, 9, 3, 64, 32, (100, 33, 2), (0, 31, 1000)),
    Case("mixed decode+prefill", torch.bfloat16, 32, 8, 128, 16, (1, 50, 1, 0, 200, 1),
         (900, 10, 3000, 5, 0, 0)),
    Case("prefill fp16 mha d64", torch.float16, 8, 8, 64, 16, (70, 3), (130, 0)),
    Case("prefill gqa16 d128", torch.bfloat16, 16, 1, 128, 32, (20, 9), (40, 0)),
    # Sliding windows (Mistral, Gemma 3, gpt-oss): the tables hold -1 for the
    # blocks before a sequence's window, which the kernels must never read.
    Case("decode window 128 (gpt-oss)", torch.bfloat16, 64, 8, 64, 16, (1,) * 4,
         (5, 127, 128, 30000), sliding_window=128),
    Case("decode window 1024 split-K", torch.bfloat16, 32, 16, 128, 16, (1, 1, 1),
         (1023, 1500, 40000), sliding_window=1024),
    Case("prefill chunks window 512", torch.bfloat16, 8, 4, 128, 16, (300, 64, 1, 700),
         (0, 2000, 600, 100), sliding_window=512),
    Case("decode sinks + window 128 split-K (gpt-oss)", torch.bfloat16, 64, 8, 64, 16,
         (1, 1, 1), (3, 5000, 40000), sliding_window=128, sinks=True),
    Case("decode + prefill sinks, full", torch.bfloat16, 64, 8, 64, 16, (1, 90, 1),
         (20000, 300, 7), sinks=True),
    # Head size 256 (Gemma 3: 1B and 270M 4 query heads / 1 KV head, 4B 8 / 4):
    # the prefill kernel's 72.6 KiB of dynamic shared memory (opted in above
    # 48 KiB), the decode kernel's widest rows (a warp per token).
    Case("decode gqa4 d256 split-K (Gemma 3 1B)", torch.bfloat16, 4, 1, 256, 16, (1,) * 5,
         (0, 31, 512, 1025, 3000)),
    Case("decode fp16 gqa8 d256 bs32", torch.float16, 16, 2, 256, 32, (1,) * 3, (1, 700, 2100)),
    Case("prefill chunks gqa2 d256 window 512 (Gemma 3 4B)", torch.bfloat16, 8, 4, 256, 16,
         (300, 64, 1, 40), (0, 1000, 600, 17), sliding_window=512),
    Case("decode window 512 split-K d256", torch.bfloat16, 8, 4, 256, 16, (1, 1, 1),
         (511, 700, 9000), sliding_window=512),
    Case("decode + prefill sinks + window 128 d256", torch.bfloat16, 8, 2, 256, 16,
         (1, 90, 1), (3000, 300, 7), sliding_window=128, sinks=True),
    Case("decode + prefill sinks, full d256", torch.bfloat16, 8, 2, 256, 16, (1, 70, 1),
         (5000, 100, 7), sinks=True),
)  # fmt: skip


def make_attention_case(case: Case, device: torch.device | str, seed: int,
                        dtype: torch.dtype | None = None) -> dict:
    """Random inputs for ``case`` on ``device``: K/V written into shuffled,
    non-contiguous blocks, every unused cache slot NaN, the output NaN.

    Returns:
        dict with query, key_cache, value_cache, block_tables, seq_lens,
        query_start_loc, out (poisoned), scale, and the host lists.
    """
    dtype = dtype or case.dtype
    g = torch.Generator().manual_seed(seed)
    q_lens = np.asarray(case.q_lens, dtype=np.int64)
    seq_lens = q_lens + np.asarray(case.ctx_lens, dtype=np.int64)
    bs = case.block_size
    blocks_per_seq = -(-seq_lens // bs)
    num_blocks = int(blocks_per_seq.sum()) + 3
    perm = torch.randperm(num_blocks, generator=g).numpy().astype(np.int32)
    tables = np.zeros((len(q_lens), max(1, int(blocks_per_seq.max())) + 1), np.int32)
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[used: used + n]
        used += n
    shape = (num_blocks, bs, case.num_kv_heads, case.head_size)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, n in enumerate(seq_lens):
        pos = np.arange(n)
        blk, off = tables[b][pos // bs], pos % bs
        key_cache[blk, off] = torch.randn(int(n), case.num_kv_heads, case.head_size,
                                          generator=g).to(dtype)
        value_cache[blk, off] = torch.randn(int(n), case.num_kv_heads, case.head_size,
                                            generator=g).to(dtype)
    if case.sliding_window:  # blocks no query can see: released (-1), as the KV cache does
        for b, n in enumerate(seq_lens):
            first = max(0, int(n) - int(q_lens[b]) - case.sliding_window + 1) // bs
            tables[b, :first] = -1
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    t = int(qsl[-1])
    query = torch.randn(t, case.num_heads, case.head_size, generator=g).to(dtype)
    dev = torch.device(device)
    return {
        "query": query.to(dev),
        "key_cache": key_cache.to(dev),
        "value_cache": value_cache.to(dev),
        "block_tables": torch.from_numpy(tables).to(dev),
        "seq_lens": torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
        "query_start_loc": torch.from_numpy(qsl).to(dev),
        "out": torch.full((t, case.num_heads, case.head_size), float("nan"), dtype=dtype,
                          device=dev),
        "scale": case.head_size**-0.5,
        "q_lens": q_lens.tolist(),
        "seq_lens_host": seq_lens.tolist(),
        "sliding_window": case.sliding_window,
        "sinks": (torch.randn(case.num_heads, generator=g) * 2).to(dev) if case.sinks else None,
    }


def reference_attention(c: dict) -> torch.Tensor:
    """float32 causal paged attention of a case (loop over sequences, torch ops on
    the case's device): [T, Hq, D] float32."""
    q, kc, vc = c["query"].float(), c["key_cache"], c["value_cache"]
    bs, hkv = kc.shape[1], kc.shape[2]
    group = q.shape[1] // hkv
    tables = c["block_tables"].long()
    ref = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    start = 0
    for b, (q_len, seq_len) in enumerate(zip(c["q_lens"], c["seq_lens_host"])):
        if q_len == 0:
            continue
        window = c.get("sliding_window", 0)
        first = max(0, seq_len - q_len - window + 1) if window else 0
        pos = torch.arange(first, seq_len, device=q.device)
        blk, off = tables[b][pos // bs], pos % bs
        k = kc[blk, off].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = vc[blk, off].float().repeat_interleave(group, dim=1)
        qb = q[start: start + q_len]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * c["scale"]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device).unsqueeze(1)
        scores.masked_fill_(pos.unsqueeze(0) > q_pos, float("-inf"))
        if window:  # each query sees p - W < k <= p
            scores.masked_fill_(pos.unsqueeze(0) <= q_pos - window, float("-inf"))
        if c.get("sinks") is not None:  # a logit column per head, softmaxed, then dropped
            sink = c["sinks"].float().view(-1, 1, 1).expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
            ref[start: start + q_len] = torch.einsum("hqk,khd->qhd", probs, v)
            start += q_len
            continue
        ref[start: start + q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
        start += q_len
    return ref


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative L2 error, whether every value is finite (the output was
    NaN-poisoned, so an unwritten row shows), and the number of all-zero
    (token, head) rows (random inputs never give one)."""
    o = out.float()
    finite = bool(torch.isfinite(o).all())
    err = float((o - ref).norm() / ref.norm().clamp_min(1e-30))
    zero_rows = int((o.flatten(1).abs().sum(1) == 0).sum())
    return {"rel_err": err, "finite": finite, "zero_rows": zero_rows, "rows": int(o.shape[0])}


def check_attention_case(case: Case, device: str, seed: int, ops_module, *,
                         workspace=None, dtype: torch.dtype | None = None,
                         kernel_hints: bool = True, reference=None) -> dict:
    """Run ``ops_module.paged_attention`` on a fresh case and compare with
    ``reference(case dict)`` (default :func:`reference_attention`). Returns the
    comparison plus ``ok`` and the seed."""
    c = make_attention_case(case, device, seed, dtype)
    kwargs = {}
    if kernel_hints:
        kwargs = {"max_query_len": max(c["q_lens"]) or 1,
                  "max_seq_len": max(c["seq_lens_host"]) or 1, "workspace": workspace}
    if case.sliding_window:
        kwargs["sliding_window"] = case.sliding_window
    if case.sinks:
        kwargs["sinks"] = c["sinks"]
    ops_module.paged_attention(c["query"], c["key_cache"], c["value_cache"], c["block_tables"],
                               c["seq_lens"], c["query_start_loc"], c["scale"], out=c["out"],
                               **kwargs)
    res = compare(c["out"], (reference or reference_attention)(c))
    tol = TOLERANCE[dtype or case.dtype]
    res.update(seed=seed, tol=tol,
               ok=res["finite"] and res["zero_rows"] == 0 and res["rel_err"] < tol)
    return res


# --------------------------------------------------------------------------- GPU phases


def build(args: argparse.Namespace, report: Report) -> bool:
    """pip install -e . for this GPU's architecture; True on success."""
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"{major}{minor}"
    env = dict(os.environ, CMAKE_ARGS=f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
               CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 4))
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e",
           str(ROOT)]
    print(f"[build] {' '.join(cmd)}  (CUDA arch {arch})", flush=True)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=PHASE_BUDGET["build"])
        ok = proc.returncode == 0
        tail = (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as e:
        ok, tail = False, f"timed out after {e.timeout} s"
    elapsed = time.time() - t0
    report.data["build"] = {"ok": ok, "seconds": elapsed, "arch": arch}
    if not ok:
        print(tail, flush=True)
        report.data["build"]["log_tail"] = tail
    report.row("build (pip install -e ., sm_" + arch + ")", f"{elapsed:.0f} s", "builds",
               status(ok))
    return ok


def phase_correctness(report: Report, clock: Clock, device: str = "cuda",
                      ops=None) -> None:
    """Every kernel case, the workspace variants, cache writes, padding rows, a
    graph replay and the tiny-model path; one table row (plus one per failure).
    ``ops``: the kernels (default :mod:`paternoster.kernels`, which dispatches
    on the device); ``device="cpu"`` with
    ``ops=paternoster.kernels.emulated_cuda_backend()`` runs the same kernels'
    code on the CPU emulation (no graph replay: not emulated)."""
    from paternoster import kernels

    ops = kernels if ops is None else ops
    emulated = device != "cuda"
    results = {}
    seed0 = int.from_bytes(os.urandom(4), "little")
    for i, case in enumerate(CASES):
        if clock.left() < 30:
            print(f"[skip] correctness: {case.name} and later (time)", flush=True)
            break
        res = check_attention_case(case, device, seed0 + i, ops)
        results[case.name] = res
        print(f"[correctness] {case.name}: rel err {res['rel_err']:.2e} "
              f"(tol {res['tol']:.0e}) finite={res['finite']} zero rows={res['zero_rows']} "
              f"{status(res['ok'])}", flush=True)
    # split-K off (no workspace: one split per sequence, many partitions) and squeezed
    # (room for 4 of the planned 32 splits) must agree as well.
    long_case = CASES[2]
    per_split = len(long_case.q_lens) * long_case.num_heads * (long_case.head_size + 2) * 4
    for label, ws in (("no workspace", torch.empty(0, dtype=torch.uint8, device=device)),
                      ("4-split workspace", torch.empty(4 * per_split, dtype=torch.uint8,
                                                        device=device))):
        res = check_attention_case(long_case, device, seed0 + 100, ops, workspace=ws)
        results[f"{long_case.name}, {label}"] = res
        print(f"[correctness] {long_case.name}, {label}: rel err {res['rel_err']:.2e} "
              f"{status(res['ok'])}", flush=True)
    results["reshape_and_cache"] = check_reshape_and_cache(ops, device, seed0 + 200)
    results["padding rows"] = check_padding_rows(ops, device, seed0 + 300)
    extra = ["reshape_and_cache", "padding rows"]
    if not emulated:
        results["cuda graph replay"] = check_graph_replay(ops, device, seed0 + 400)
        extra.append("cuda graph replay")
    if clock.left() > 60:
        name = "model path vs HF (tiny llama, " + ("emulated kernels)" if emulated else "graphs)")
        results[name] = check_model_path(seed0 + 500, device=device,
                                         attn_ops=None if ops is kernels else ops)
        extra.append(name)
    for i, family in enumerate(TINY_HYBRIDS):  # each kind of recurrent state
        if clock.left() > 60:
            name = f"hybrid model path vs HF (tiny {family}" + (", emulated)" if emulated
                                                                 else ")")
            results[name] = check_hybrid_model_path(seed0 + 600 + i, device=device,
                                                    attn_ops=None if ops is kernels else ops,
                                                    family=family)
            extra.append(name)
    for name in extra:
        print(f"[correctness] {name}: {results[name]}", flush=True)
    report.data["correctness"] = results
    failed = [n for n, r in results.items() if not r["ok"]]
    worst = max((r["rel_err"] for r in results.values() if "rel_err" in r), default=float("nan"))
    where = ", CPU emulation" if emulated else ""
    report.row(f"kernel correctness ({len(results)} cases{where})",
               f"{len(results) - len(failed)}/{len(results)} pass, worst rel err {worst:.1e}",
               "all pass (kernels: bf16 < 1e-2, fp16 < 5e-3; model paths < 5e-2)",
               status(not failed))
    for n in failed:
        report.row(f"  failed: {n}", json.dumps(results[n])[:60], "", "FAIL")


def check_reshape_and_cache(ops, device: str, seed: int) -> dict:
    """bf16 and fp16 cache writes against an index-put reference: valid slots
    written exactly, skipped (-1) tokens and untouched slots left NaN."""
    g = torch.Generator().manual_seed(seed)
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        t, hkv, d, nb, bs = 50, 8, 128, 20, 16
        key = torch.randn(t, hkv, d, generator=g).to(dtype)
        value = torch.randn(t, hkv, d, generator=g).to(dtype)
        slots = torch.randperm(nb * bs, generator=g)[:t]
        slots[::7] = -1
        kc = torch.full((nb, bs, hkv, d), float("nan"), dtype=dtype)
        vc = kc.clone()
        ref_k, ref_v = kc.clone(), vc.clone()
        keep = slots >= 0
        ref_k.view(-1, hkv, d)[slots[keep]] = key[keep]
        ref_v.view(-1, hkv, d)[slots[keep]] = value[keep]
        kc_d, vc_d = kc.to(device), vc.to(device)
        ops.reshape_and_cache(key.to(device), value.to(device), kc_d, vc_d, slots.to(device))
        ok &= torch.equal(kc_d.cpu().nan_to_num(7.0), ref_k.nan_to_num(7.0))
        ok &= torch.equal(vc_d.cpu().nan_to_num(7.0), ref_v.nan_to_num(7.0))
    return {"ok": bool(ok)}


def check_padding_rows(ops, device: str, seed: int) -> dict:
    """seq_lens 0 decode rows (CUDA graph padding) come out as zeros."""
    c = make_attention_case(CASES[0], device, seed)
    c["seq_lens"][::2] = 0
    ops.paged_attention(c["query"], c["key_cache"], c["value_cache"], c["block_tables"],
                        c["seq_lens"], c["query_start_loc"], c["scale"], out=c["out"],
                        max_query_len=1)
    pad = c["out"][::2].float()
    return {"ok": bool((pad == 0).all()) and bool(torch.isfinite(c["out"]).all())}


def check_graph_replay(ops, device: str, seed: int, reference=None) -> dict:
    """Capture one decode call (max_seq_len 8192), replay it on new contents;
    compared with ``reference`` as in :func:`check_attention_case`."""
    case = Case("graph", torch.bfloat16, 32, 8, 128, 16, (1,) * 8, (8000,) * 8)
    c = make_attention_case(case, device, seed)
    ws = ops.alloc_decode_workspace(device, 8, 32, 8, 128, 8192)
    args = [c[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens",
                           "query_start_loc")]
    kwargs = {"out": c["out"], "max_query_len": 1, "max_seq_len": 8192, "workspace": ws}
    ops.paged_attention(*args, c["scale"], **kwargs)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.paged_attention(*args, c["scale"], **kwargs)
    new_lens = torch.tensor([1, 100, 513, 2048, 4097, 6000, 7999, 8000], dtype=torch.int32)
    c["seq_lens"].copy_(new_lens)
    c["seq_lens_host"] = new_lens.tolist()
    c["out"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    res = compare(c["out"], (reference or reference_attention)(c))
    res["ok"] = res["finite"] and res["zero_rows"] == 0 and res["rel_err"] < 1e-2
    return res


TINY_LLAMA = {
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048,
    "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}  # fmt: skip


def paged_batch(seqs: list[list[int]], starts: list[int], counts: list[int], block_size: int,
                blocks_per_seq: int) -> dict[str, np.ndarray]:
    """Runner batch arrays for sequence b computing tokens [starts[b], starts[b] +
    counts[b]) of seqs[b]; sequence b owns blocks b * blocks_per_seq ...
    (a stand-in for the C++ BatchBuilder)."""
    ids, pos, slots, tables, lens, qsl, last = [], [], [], [], [], [0], []
    for b, (seq, start, n) in enumerate(zip(seqs, starts, counts)):
        blocks = np.arange(b * blocks_per_seq, (b + 1) * blocks_per_seq, dtype=np.int32)
        p = np.arange(start, start + n)
        ids.extend(seq[start: start + n])
        pos.extend(p.tolist())
        slots.extend((blocks[p // block_size] * block_size + p % block_size).tolist())
        tables.append(blocks)
        lens.append(start + n)
        qsl.append(qsl[-1] + n)
        last.append(qsl[-1] - 1)
    return {"input_ids": np.array(ids, np.int64), "positions": np.array(pos, np.int64),
            "slot_mapping": np.array(slots, np.int64), "block_tables": np.stack(tables),
            "seq_lens": np.array(lens, np.int32), "query_start_loc": np.array(qsl, np.int32),
            "logits_indices": np.array(last, np.int64)}


def greedy_steps(step, seqs: list[list[int]], steps: int, block_size: int,
                 blocks_per_seq: int) -> list[torch.Tensor]:
    """A prefill of every sequence whole, then ``steps`` greedy decode steps,
    each through ``step`` (a runner's ``execute_model`` / ``compute_logits``
    on :func:`paged_batch` arrays); the chosen ids are appended to ``seqs``.
    Returns each step's ``[len(seqs), V]`` logits."""
    lens = [len(s) for s in seqs]
    logits = [step(paged_batch(seqs, [0] * len(seqs), lens, block_size, blocks_per_seq))]
    for _ in range(steps):
        for seq, tok in zip(seqs, logits[-1].argmax(-1).tolist()):
            seq.append(tok)
        logits.append(step(paged_batch(seqs, [len(s) - 1 for s in seqs], [1] * len(seqs),
                                       block_size, blocks_per_seq)))
    return logits


def rel_errors(hf, seqs: list[list[int]], lens: list[int], logits: list[torch.Tensor],
               device) -> list[float]:
    """Per sequence, ``||ours - ref|| / ||ref||`` of the logits ``greedy_steps``
    returned against HF ``hf``'s forward over the whole generated sequence
    (positions ``lens[b] - 1`` on, float32)."""
    errs = []
    with torch.inference_mode():
        for b, (seq, n) in enumerate(zip(seqs, lens)):
            ref = hf(torch.tensor([seq], device=device)).logits[0, n - 1:].float()
            ours = torch.stack([step[b] for step in logits]).to(device)
            errs.append(float((ours - ref).norm() / ref.norm()))
    return errs


def check_model_path(seed: int, steps: int = 12, device: str = "cuda",
                     attn_ops=None) -> dict:
    """The whole GPU model path on a tiny random Llama (safetensors via
    save_pretrained): ModelRunner on cuda in bf16 with CUDA graphs, a prefill
    step then ``steps`` greedy decode steps (graph replays), against HF's
    float32 forward of the same bf16-rounded weights over the generated
    sequences. Logits' relative L2 error per step < 5e-2 (bf16 activations).
    ``device="cpu"`` runs the same check on the CPU kernels (no graphs), or
    on ``attn_ops`` (e.g. the emulated CUDA backend) when given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(torch.bfloat16)
    bs, per_seq = 16, 32
    with tempfile.TemporaryDirectory(prefix="pn-tiny-llama-") as model_dir:
        hf.save_pretrained(model_dir)
        runner = ModelRunner(
            ModelConfig(model=model_dir, dtype="bfloat16", device=device,
                        cuda_graphs=device == "cuda"),
            CacheConfig(block_size=bs, num_kv_blocks=8 * per_seq), max_num_seqs=8,
            max_num_batched_tokens=2048, attn_ops=attn_ops,
        )
    hf = hf.float().to(device).eval()
    g = torch.Generator().manual_seed(seed)
    lens = [5, 60, 200, 17, 1]
    seqs = [torch.randint(0, TINY_LLAMA["vocab_size"], (n,), generator=g).tolist() for n in lens]
    logits = greedy_steps(runner.execute_model, seqs, steps, bs, per_seq)
    errs = rel_errors(hf, seqs, lens, logits, device)
    worst = max(errs)
    return {"rel_err_per_seq": errs, "rel_err": worst, "ok": worst < 5e-2,
            "graphs": runner.graphs is not None}


TINY_QWEN3_5 = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
    "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "max_position_embeddings": 1024,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "pad_token_id": 0,
}  # fmt: skip
#: Tiny hybrids, one per kind of recurrent state: (HF class, config class, arguments).
TINY_HYBRIDS = {
    "Qwen3.5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", TINY_QWEN3_5),
    "LFM2": ("Lfm2ForCausalLM", "Lfm2Config", {
        "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 1024, "pad_token_id": 0,
        "layer_types": ["conv", "conv", "full_attention", "conv"]}),
    # Dense: a routed MoE's choices flip on bf16 rounding against the float32
    # reference (its experts' path is the CPU tests' torch code).
    "Nemotron-H": ("NemotronHForCausalLM", "NemotronHConfig", {
        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 512, "ssm_state_size": 32, "mamba_num_heads": 8,
        "mamba_head_dim": 64, "n_groups": 2, "conv_kernel": 4, "chunk_size": 64,
        "vocab_size": 512, "max_position_embeddings": 1024, "pad_token_id": 0,
        "layers_block_type": ["linear_attention", "mlp", "full_attention",
                              "linear_attention", "mlp"]}),
}  # fmt: skip


def _tiny_hybrid(family: str):
    """A tiny random HF model of ``family`` (a key of :data:`TINY_HYBRIDS`)."""
    import transformers as tf

    cls_name, cfg_name, kwargs = TINY_HYBRIDS[family]
    model = getattr(tf, cls_name)(getattr(tf, cfg_name)(**kwargs))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if family == "Qwen3.5" and name.endswith("norm.weight") and "linear_attn" not in name:
                param.uniform_(-0.5, 0.5)  # the 1 + w norms away from their 0 init
    return model


def check_hybrid_model_path(seed: int, steps: int = 8, device: str = "cuda",
                            attn_ops=None, family: str = "Qwen3.5") -> dict:
    """The GPU model path of a hybrid model (``family``: Qwen3.5's Gated
    DeltaNet, LFM2's short convolutions, Nemotron-H's Mamba2 with
    cacheless MLP blocks; :data:`TINY_HYBRIDS`) on ``device`` in bf16 (no CUDA graphs:
    the state update reads the batch on the host), its state slots and
    blocks from the C++ KV cache manager's recurrent-state group; a prefill
    step of five sequences (one crossing the delta rule's and the scan's
    64-token chunks) then ``steps`` greedy decode steps, against HF's
    float32 forward of the same bf16-rounded weights. Logits' relative L2
    error per sequence < 5e-2. ``device="cpu"`` with ``attn_ops`` (the
    emulated CUDA backend) runs it on the CPU emulation."""
    from paternoster import _core
    from paternoster.config import CacheConfig, ModelConfig
    from paternoster.model.runner import ModelRunner

    torch.manual_seed(seed)
    hf = _tiny_hybrid(family).to(torch.bfloat16)
    vocab = hf.config.vocab_size
    bs = 16
    with tempfile.TemporaryDirectory(prefix="pn-tiny-hybrid-") as model_dir:
        hf.save_pretrained(model_dir)
        runner = ModelRunner(
            ModelConfig(model=model_dir, dtype="bfloat16", device=device),
            CacheConfig(block_size=bs, num_kv_blocks=128), max_num_seqs=8,
            max_num_batched_tokens=2048, attn_ops=attn_ops)
        ref_model = type(hf).from_pretrained(model_dir, dtype=torch.float32)
    ref_model = ref_model.to(device).eval()
    kv = _core.KVCacheManager(runner.num_kv_blocks, bs,
                              sliding_windows=list(runner.kv_cache_group_windows),
                              recurrent=list(runner.kv_cache_group_recurrent),
                              num_state_slots=runner.num_state_slots)
    builder = _core.BatchBuilder(kv)
    g = torch.Generator().manual_seed(seed)
    lens = [5, 70, 200, 17, 1]
    seqs = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    ids = np.arange(len(seqs), dtype=np.int64)
    for i, seq in enumerate(seqs):
        builder.add_request(i, np.asarray(seq, np.int64))

    def step(starts: list[int], counts: list[int]) -> torch.Tensor:
        for i, (c, n) in enumerate(zip(starts, counts)):
            assert kv.allocate_slots(i, c + n, c)
        batch = builder.build(ids, np.asarray(starts, np.int32), np.asarray(counts, np.int32))
        return runner.execute_model(batch)

    logits = [step([0] * len(seqs), lens)]
    for _ in range(steps):
        tokens = logits[-1].argmax(-1).tolist()
        for seq, tok in zip(seqs, tokens):
            seq.append(tok)
        builder.append_tokens(ids, np.asarray(tokens, np.int64))
        logits.append(step([len(s) - 1 for s in seqs], [1] * len(seqs)))
    errs = []
    with torch.inference_mode():
        for b, (seq, n) in enumerate(zip(seqs, lens)):
            ref = ref_model(torch.tensor([seq], device=device)).logits[0, n - 1:].float()
            ours = torch.stack([out[b] for out in logits]).float().to(device)
            errs.append(float((ours - ref).norm() / ref.norm()))
    worst = max(errs)
    return {"rel_err_per_seq": errs, "rel_err": worst, "ok": worst < 5e-2}


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write: 2 x nbytes / time)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    return 2 * nbytes / float(np.median(times))


def phase_kernel(report: Report, bandwidth: float) -> None:
    """Decode kernel time at 64 x 2048 context (block 16 and 32), 20 calls per
    CUDA graph replay, median of 5 replays; bytes of K/V + Q + out per second
    against the copy bandwidth."""
    from paternoster import kernels as ops

    results = {}
    for bs in (16, 32):
        case = Case(f"bench bs{bs}", torch.bfloat16, 32, 8, 128, bs, (1,) * 64, (2047,) * 64)
        c = make_attention_case(case, "cuda", 1234)
        ws = ops.alloc_decode_workspace("cuda", 64, 32, 8, 128, 2048)
        args = [c[k] for k in ("query", "key_cache", "value_cache", "block_tables", "seq_lens",
                               "query_start_loc")]
        kw = {"out": c["out"], "max_query_len": 1, "max_seq_len": 2048, "workspace": ws}
        for _ in range(3):
            ops.paged_attention(*args, c["scale"], **kw)
        graph = torch.cuda.CUDAGraph()  # 20 launches in a graph: no launch gaps in the timing
        with torch.cuda.graph(graph):
            for _ in range(20):
                ops.paged_attention(*args, c["scale"], **kw)
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / 20)
        t = float(np.median(times))
        kv = 2 * 64 * 2048 * 8 * 128 * 2
        qo = 2 * 64 * 32 * 128 * 2
        eff = (kv + qo) / t
        results[f"bs{bs}"] = {"seconds": t, "bytes": kv + qo, "bytes_per_s": eff,
                              "fraction_of_copy": eff / bandwidth}
        print(f"[kernel] decode 64 x 2048 bf16 32q/8kv D128 bs{bs}: {t * 1e6:.1f} us, "
              f"{eff / 1e12:.2f} TB/s = {eff / bandwidth:.0%} of copy", flush=True)
        del graph, c, ws
    report.data["kernel"] = results
    r = results["bs16"]
    report.row("decode kernel 64x2k bf16 32q/8kv D128 bs16",
               f"{r['seconds'] * 1e6:.0f} us, {r['bytes_per_s'] / 1e12:.2f} TB/s = "
               f"{r['fraction_of_copy']:.0%}", ">= 80% of copy BW",
               status(r["fraction_of_copy"] >= 0.8))
    r = results["bs32"]
    report.row("  same, block size 32", f"{r['bytes_per_s'] / 1e12:.2f} TB/s = "
               f"{r['fraction_of_copy']:.0%}", "(info)", "info")


def write_model_dir(layers: int) -> Path:
    """A temporary directory with the Llama-3-8B-shaped config.json only
    (removed when the process exits)."""
    d = Path(tempfile.mkdtemp(prefix="pn-llama3-8b-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    cfg = dict(LLAMA3_8B, num_hidden_layers=layers)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def roofline_bytes(model, batch: int, mean_ctx: float, cfg: dict) -> tuple[int, float]:
    """(weight bytes read per decode step, KV bytes read per step)."""
    weights = sum(p.numel() * p.element_size() for layer in model.layers
                  for p in layer.parameters())
    weights += model.norm.weight.numel() * model.norm.weight.element_size()
    weights += model.lm_head.numel() * model.lm_head.element_size()
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    return weights, batch * mean_ctx * per_token


def phase_e2e(args: argparse.Namespace, report: Report, clock: Clock, bandwidth: float,
              model_dir: Path) -> dict:
    """EngineCore (fcfs, CUDA graphs, dummy weights) over each batch size: wall
    time and generated tokens, median pure-decode step against the roofline.
    Returns per batch size the numbers of the JSON file."""
    from paternoster.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from paternoster.engine.core import EngineCore
    from paternoster.engine.messages import EngineCoreRequest
    from paternoster.sampling_params import SamplingParams

    cfg = dict(LLAMA3_8B, num_hidden_layers=args.layers)
    max_batch = max(args.batches)
    config = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="bfloat16", device="cuda",
                          load_format="dummy", cuda_graphs=not args.no_graphs,
                          max_model_len=args.prompt_len + args.gen_len + 16),
        cache=CacheConfig(block_size=16, gpu_memory_utilization=args.gpu_memory_utilization),
        scheduler=SchedulerConfig(scheduler="fcfs", max_num_seqs=max_batch,
                                  max_num_batched_tokens=8192),
    )
    t0 = time.time()
    engine = EngineCore(config)
    init_s = time.time() - t0
    print(f"[e2e] engine up in {init_s:.1f} s: {engine.runner.num_kv_blocks} KV blocks, "
          f"graphs={'on' if engine.runner.graphs else 'off'}", flush=True)
    rng = np.random.default_rng(0)
    results = {"init_seconds": init_s, "layers": args.layers}
    for batch in args.batches:
        if clock.left() < 40:
            print(f"[skip] e2e batch {batch} and later (time)", flush=True)
            break
        params = SamplingParams(temperature=0.0, max_tokens=args.gen_len, ignore_eos=True)
        for i in range(batch):
            ids = rng.integers(0, cfg["vocab_size"], args.prompt_len).tolist()
            engine.add_request(EngineCoreRequest(f"b{batch}-{i}", ids, params))
        first = len(engine.step_log)
        torch.cuda.synchronize()
        t = time.time()
        generated = 0
        while engine.has_unfinished_requests():
            generated += sum(len(o.new_token_ids) for o in engine.step())
        wall = time.time() - t
        steps = list(engine.step_log)[first:]
        decode = [s.duration for s in steps
                  if len(s.scheduled) == batch and all(n == 1 for _, n in s.scheduled)]
        step_s = float(np.median(decode)) if decode else float("nan")
        w_bytes, kv_bytes = roofline_bytes(engine.runner.model, batch,
                                           args.prompt_len + args.gen_len / 2, cfg)
        roof_s = (w_bytes + kv_bytes) / bandwidth
        results[batch] = {
            "wall_seconds": wall, "generated_tokens": generated,
            "e2e_tokens_per_s": generated / wall, "decode_steps": len(decode),
            "median_decode_step_s": step_s, "decode_tokens_per_s": batch / step_s,
            "weight_bytes": w_bytes, "kv_bytes_per_step": kv_bytes,
            "roofline_step_s": roof_s, "fraction_of_roofline": roof_s / step_s,
        }
        print(f"[e2e] batch {batch}: {generated} tokens in {wall:.1f} s "
              f"({generated / wall:.0f} tok/s e2e); decode step {step_s * 1e3:.2f} ms "
              f"= {batch / step_s:.0f} tok/s, roofline {roof_s * 1e3:.2f} ms "
              f"-> {roof_s / step_s:.0%}", flush=True)
    report.data["e2e"] = results
    for batch in args.batches:
        r = results.get(batch)
        target = ">= 70% of roofline" if batch == 256 else "(info)"
        if r is None:
            report.row(f"e2e decode batch {batch}", "skipped", target, "n/a")
            continue
        ok = r["fraction_of_roofline"] >= 0.7 if batch == 256 else None
        step_ms = r["median_decode_step_s"] * 1e3
        report.row(f"e2e decode batch {batch} (Llama-3-8B shape, {args.layers} layers)",
                   f"{r['decode_tokens_per_s']:.0f} tok/s, step {step_ms:.2f} ms = "
                   f"{r['fraction_of_roofline']:.0%} of roofline", target,
                   status(ok) if ok is not None else "info")
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return results


def phase_peer(args: argparse.Namespace, report: Report, ours: dict) -> None:
    """HF transformers on the same workload at the largest batch."""
    import transformers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    batch = max(args.batches)
    cfg = dict(LLAMA3_8B, num_hidden_layers=args.layers)
    cfg.pop("architectures")
    cfg.pop("torch_dtype")
    config = LlamaConfig(**cfg)
    with torch.device("cuda"):
        try:  # transformers 5 names it dtype, 4.x torch_dtype
            model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
        except TypeError:
            model = LlamaForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
    model = model.to(torch.bfloat16).eval()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg["vocab_size"], args.prompt_len).tolist() for _ in range(batch)]
    gen = GenerationConfig(max_new_tokens=args.gen_len, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    method = "generate_batch" if hasattr(model, "generate_batch") else "generate"
    print(f"[peer] transformers {transformers.__version__} {method}, batch {batch}", flush=True)
    t = time.time()
    generated = 0
    with torch.inference_mode():
        if method == "generate_batch":
            try:
                out = model.generate_batch(inputs=prompts, generation_config=gen)
                generated = sum(len(r.generated_tokens) for r in out.values())
            except Exception as e:  # an API drift must not cost the comparison
                print(f"[peer] generate_batch failed ({type(e).__name__}: {e}); "
                      "falling back to static generate", flush=True)
                method = "generate"
                t = time.time()
        if method == "generate":
            ids = torch.tensor(prompts, device="cuda")
            res = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 generation_config=gen, min_new_tokens=args.gen_len)
            generated = int((res.shape[1] - ids.shape[1]) * batch)
    torch.cuda.synchronize()
    wall = time.time() - t
    peer = {"method": method, "version": transformers.__version__, "batch": batch,
            "wall_seconds": wall, "generated_tokens": generated,
            "tokens_per_s": generated / wall}
    report.data["peer"] = peer
    mine = ours.get(batch)
    ratio = mine["e2e_tokens_per_s"] / peer["tokens_per_s"] if mine else float("nan")
    peer["ratio"] = ratio
    print(f"[peer] {generated} tokens in {wall:.1f} s = {generated / wall:.0f} tok/s; "
          f"Paternoster/HF = {ratio:.2f}x", flush=True)
    report.row(f"vs HF {method} @ batch {batch} (tok/s incl. prefill)",
               f"{mine['e2e_tokens_per_s']:.0f} vs {peer['tokens_per_s']:.0f} = {ratio:.1f}x"
               if mine else f"HF {peer['tokens_per_s']:.0f}, ours skipped", ">= 3x",
               status(ratio >= 3) if mine else "n/a")
    del model
    gc.collect()
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------- dry run


def dry_run(args: argparse.Namespace, report: Report, clock: Clock) -> None:
    """Everything that runs on a CPU: the model config and roofline arithmetic,
    then the whole correctness phase on the CPU emulation of the CUDA kernels
    (``paternoster._cuda_emu``, when built); the GPU-only rows read n/a."""
    from transformers import LlamaConfig

    from paternoster import kernels

    model_dir = write_model_dir(args.layers)
    cfg = dict(LLAMA3_8B, num_hidden_layers=args.layers)
    hf = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    h, i, v = hf.hidden_size, hf.intermediate_size, hf.vocab_size
    q_kv = hf.num_attention_heads * 128 + 2 * hf.num_key_value_heads * 128
    per_layer = h * q_kv + hf.num_attention_heads * 128 * h + 3 * h * i + 2 * h
    params = args.layers * per_layer + 2 * v * h + h
    weight_bytes = (args.layers * per_layer + v * h + h) * 2  # read per decode step
    print(f"[dry-run] model config written to {model_dir}/config.json: Llama-3-8B shapes, "
          f"{args.layers} layers, {params / 1e9:.2f} B parameters, "
          f"{weight_bytes / 1e9:.2f} GB read per decode step", flush=True)
    nominal_bw = 4.8e12  # H200 HBM3e spec, for the arithmetic only
    per_token = 2 * args.layers * 8 * 128 * 2
    for batch in args.batches:
        kv = batch * (args.prompt_len + args.gen_len / 2) * per_token
        print(f"[dry-run] batch {batch}: KV {kv / 1e9:.2f} GB/step, roofline step "
              f"{(weight_bytes + kv) / nominal_bw * 1e3:.2f} ms at a nominal 4.8 TB/s "
              f"-> {batch * nominal_bw / (weight_bytes + kv):.0f} tok/s", flush=True)
    kv_bench = 2 * 64 * 2048 * 8 * 128 * 2
    print(f"[dry-run] kernel bench moves {kv_bench / 2**20:.0f} MiB of K/V: "
          f"{kv_bench / nominal_bw * 1e6:.0f} us at 4.8 TB/s", flush=True)

    if "correctness" in args.skip:
        report.row("kernel correctness", "skipped", "", "n/a")
    elif kernels.cuda_emulation_available():
        print("[dry-run] correctness phase on the CPU emulation of the CUDA kernels "
              "(cuda/emu): same kernels, same cases, no timing", flush=True)
        phase_correctness(report, clock, device="cpu", ops=kernels.emulated_cuda_backend())
    else:
        print("[dry-run] paternoster._cuda_emu is not built (no CUDA toolkit at build "
              "time): no kernel correctness on the CPU", flush=True)
        report.row("kernel correctness", "n/a (no GPU, no emulation)", "", "n/a")
    loaded = [m for m in FORBIDDEN_MODULES if m in sys.modules]
    print(f"[dry-run] HTTP/ZMQ modules imported: {loaded or 'none'}", flush=True)
    report.row("imports (no HTTP/ZMQ modules)", ", ".join(loaded) or "none", "none",
               status(not loaded))
    print("[dry-run] tensor parallel: the TP=2 checks (layers, model, LLM) over gloo on "
          "the CPU (on a machine with >= 2 GPUs they run over NCCL)", flush=True)
    from gpu_check_tp import phase_tensor_parallel

    phase_tensor_parallel(report, "gloo", TINY_LLAMA)
    for name in ("build", "decode kernel 64x2k bf16 32q/8kv D128 bs16"):
        report.row(name, "n/a (no GPU)", "", "n/a")
    for batch in args.batches:
        report.row(f"e2e decode batch {batch}", "n/a (no GPU)",
                   ">= 70% of roofline" if batch == 256 else "(info)", "n/a")
    report.row(f"vs HF generate_batch @ batch {max(args.batches)}", "n/a (no GPU)", ">= 3x",
               "n/a")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="CPU only: no build, no GPU phases")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                   help="directory for gpu_check.json (default $OUT)")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--skip-build", action="store_true", help="use the installed package")
    p.add_argument("--layers", type=int, default=32, help="decoder layers of the 8B shape")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--no-graphs", action="store_true", help="e2e without CUDA graphs")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["correctness", "kernel", "e2e", "peer", "tp"], help="phases to skip")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the phases in budget; 0 when every checked target passed."""
    args = parse_args(argv)
    deadline = args.deadline or time.time() + args.budget - 15  # margin for the table
    clock = Clock(deadline)
    report = Report()
    report.data["args"] = vars(args)
    report.data["platform"] = {"python": platform.python_version(), "torch": torch.__version__,
                               "numpy": np.__version__}
    if args.dry_run:
        dry_run(args, report, clock)
        report.print_table()
        print(f"wrote {report.write(Path(args.out))}")
        return int(any(r[3] == "FAIL" for r in report.rows))
    if not torch.cuda.is_available():
        print("no CUDA GPU visible to torch; use --dry-run", flush=True)
        return 2
    report.data["platform"]["gpu"] = torch.cuda.get_device_name(0)
    if not args.skip_build:
        if not build(args, report):
            report.print_table()
            print(f"wrote {report.write(Path(args.out))}")
            return 1
        # A fresh interpreter picks up the editable install.
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        os.execv(sys.executable, [sys.executable, __file__, *rest, "--skip-build",
                                  "--deadline", str(deadline)])
    from paternoster import kernels

    print(f"[env] {report.data['platform']}, CUDA kernels: {kernels.cuda_kernels_available()}",
          flush=True)
    code = 0
    try:
        if "correctness" not in args.skip and clock.allows("correctness", 20):
            phase_correctness(report, clock)
        bandwidth = copy_bandwidth()
        report.data["copy_bandwidth"] = bandwidth
        report.row("device-to-device copy bandwidth", f"{bandwidth / 1e12:.2f} TB/s",
                   "(reference)", "info")
        if "kernel" not in args.skip and clock.allows("kernel", 15):
            phase_kernel(report, bandwidth)
        ours: dict = {}
        if "e2e" not in args.skip and clock.allows("e2e", 90):
            ours = phase_e2e(args, report, clock, bandwidth, write_model_dir(args.layers))
        if "peer" not in args.skip and clock.allows("peer", 60):
            phase_peer(args, report, ours)
        if "tp" not in args.skip and clock.allows("tp", 45):
            from gpu_check_tp import phase_tensor_parallel

            phase_tensor_parallel(report, "nccl", TINY_LLAMA)
    except Exception as e:  # report what ran, then the error
        import traceback

        traceback.print_exc()
        report.row("error", f"{type(e).__name__}: {e}"[:80], "", "FAIL")
        report.data["error"] = traceback.format_exc()
        code = 1
    report.print_table()
    print(f"wrote {report.write(Path(args.out))}")
    failed = any(r[3] == "FAIL" for r in report.rows)
    return code or int(failed)


if __name__ == "__main__":
    sys.exit(main())
