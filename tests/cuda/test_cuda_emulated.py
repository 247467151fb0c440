"""The CUDA kernels' own code on a CPU: ``paternoster._cuda_emu`` compiles
cuda/src unchanged against the emulation of the CUDA execution model in
cuda/emu (every CUDA thread a fiber; __syncthreads, __syncwarp and warp
shuffles exact), and :func:`paternoster.kernels.emulated_cuda_backend` wraps it
in the same Python backend as on a GPU, for CPU tensors.

Checked with bench/gpu_check.py's cases against the suite's float64
reference (tests/paged_attention_ref.py; fresh random inputs, NaN-poisoned
outputs and unused cache slots, relative L2 error below the dtype's tolerance,
no zero rows): every correctness case of the GPU check, the split-K
variants, both cache-write paths, padding rows, and the model runner's
forward against HF transformers. Shuffled thread orders must
give bit-identical results (a missing barrier would not). Timing, occupancy
and the CUDA graph capture are not emulated: those stay with the GPU run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from paternoster import kernels

from .conftest import case_reference, check_attention_case, load_gpu_check

gc = load_gpu_check()

pytestmark = pytest.mark.skipif(not kernels.cuda_emulation_available(),
                                reason="paternoster._cuda_emu not built (needs the CUDA toolkit)")

# The GPU check's cases; its 40k-token split-K case is shortened (same plan:
# 32 splits of one sequence, partitions merged inside a split without workspace).
LONG = dataclasses.replace(gc.CASES[2], name="decode split-K 9k ctx", ctx_lens=(9000, 700))
CASES = [LONG if c is gc.CASES[2] else c for c in gc.CASES]


@pytest.fixture
def backend():
    """The emulated CUDA backend, its launch statistics reset."""
    backend = kernels.emulated_cuda_backend()
    backend.module.emu_stats(True)
    return backend


def assert_ok(res: dict) -> None:
    assert res["finite"], res
    assert res["zero_rows"] == 0, res
    assert res["rel_err"] < res["tol"], res


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_paged_attention_matches_reference(backend, case):
    res = check_attention_case(case, "cpu", seed=torch.seed() % 2**31, ops_module=backend)
    assert_ok(res)
    stats = backend.module.emu_stats()
    assert stats["launches"] >= 1 and stats["threads"] > 0  # the emulated kernels ran


@pytest.mark.parametrize("case", [c for c in CASES if c.dtype == torch.bfloat16][:3],
                         ids=lambda c: c.name)
def test_float16_variant_matches_reference(backend, case):
    assert_ok(check_attention_case(case, "cpu", seed=3, ops_module=backend, dtype=torch.float16))


# Workspace bytes of one split of LONG: 2 sequences x 32 heads x (D + 2) floats.
PER_SPLIT = 2 * 32 * (128 + 2) * 4


def test_the_long_case_splits_and_the_workspace_bounds_the_splits(backend):
    assert backend.module.decode_num_splits(2, 32, 8, 9001, 132) == 32
    blocks = {}
    for label, ws in (("planned", None), ("none", torch.empty(0, dtype=torch.uint8)),
                      ("small", torch.empty(4 * PER_SPLIT + 100, dtype=torch.uint8))):
        backend.module.emu_stats(True)
        assert_ok(check_attention_case(LONG, "cpu", seed=11, ops_module=backend, workspace=ws))
        blocks[label] = backend.module.emu_stats()["blocks"]
    # decode grid: 8 kv heads x 2 sequences x splits (+ 2 x 32 reduction blocks when split)
    assert blocks["none"] == 16
    assert blocks["planned"] == 16 * 32 + 2 * 32
    assert blocks["small"] == 16 * 4 + 2 * 32  # room for 4 splits: 4 are used


def test_default_hints_launch_both_kernels(backend):
    assert_ok(check_attention_case(gc.CASES[10], "cpu", seed=12, ops_module=backend,
                                      kernel_hints=False))


def test_head_size_256_splits_the_decode_and_runs_the_prefill(backend):
    """Gemma 3's head size: the decode of a 3000-token context splits (one
    warp per token row; the reduction runs 256 threads), and the prefill
    kernel's 72.6 KiB of dynamic shared memory launches (the emulation refuses
    more than 48 KiB without the opt-in, as a GPU does)."""
    case = next(c for c in gc.CASES if c.name.startswith("decode gqa4 d256 split-K"))
    assert backend.module.decode_num_splits(5, 4, 1, 3001, 132) == 24
    assert_ok(check_attention_case(case, "cpu", seed=13, ops_module=backend))
    # decode grid: 1 kv head x 5 sequences x 24 splits, + 5 x 4 reduction blocks
    assert backend.module.emu_stats()["blocks"] == 5 * 24 + 5 * 4
    prefill = gc.Case("prefill d256", torch.bfloat16, 4, 1, 256, 16, (70, 1), (40, 300))
    backend.module.emu_stats(True)
    assert_ok(check_attention_case(prefill, "cpu", seed=14, ops_module=backend))
    # decode grid (2 sequences, 3 splits of 301 tokens), its reduction (2 x 4),
    # prefill grid: ceil(70 / 16) tiles x 2 sequences x 1 kv head
    assert backend.module.emu_stats()["launches"] == 3
    assert backend.module.emu_stats()["blocks"] == 2 * 3 + 2 * 4 + 5 * 2


SHUFFLED = (
    gc.Case("decode split-K gqa4", torch.bfloat16, 8, 2, 128, 16, (1, 1, 1), (1, 300, 1200)),
    gc.Case("prefill over context gqa4", torch.bfloat16, 8, 2, 128, 16, (37, 5), (100, 17)),
    CASES[9],
    gc.Case("prefill + split-K decode d256", torch.bfloat16, 4, 2, 256, 16, (37, 1, 5),
            (100, 1500, 17)),
)


@pytest.mark.parametrize("case", SHUFFLED, ids=lambda c: c.name)
def test_shuffled_thread_orders_give_identical_results(case):
    """Each thread runs alone between barriers; a shared-memory read that lacks
    a barrier after its write would see a different value in another order."""
    outs = []
    for seed in (0, 1, 0x9E3779B97F4A7C15):
        backend = kernels.emulated_cuda_backend(schedule_seed=seed)
        c = gc.make_attention_case(case, "cpu", seed=21)
        backend.paged_attention(c["query"], c["key_cache"], c["value_cache"],
                                c["block_tables"], c["seq_lens"], c["query_start_loc"],
                                c["scale"], out=c["out"], max_query_len=max(c["q_lens"]),
                                max_seq_len=max(c["seq_lens_host"]))
        outs.append(c["out"])
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    res = gc.compare(outs[0], case_reference(c))
    assert res["finite"] and res["rel_err"] < gc.TOLERANCE[case.dtype], res


def test_reshape_and_cache_writes_only_valid_slots(backend):
    assert gc.check_reshape_and_cache(backend, "cpu", seed=5)["ok"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reshape_and_cache_narrow_rows(backend, dtype):
    """Rows that are not 16-byte multiples (Hkv * D * 2 = 12 bytes) take the
    4-byte copy; negative slots are skipped."""
    t, hkv, d, nb, bs = 9, 1, 6, 4, 8
    key = torch.randn(t, hkv, d).to(dtype)
    value = torch.randn(t, hkv, d).to(dtype)
    slots = torch.tensor([0, 5, 31, -1, 17, 8, 30, -7, 2], dtype=torch.int64)
    kc = torch.full((nb, bs, hkv, d), float("nan"), dtype=dtype)
    vc = kc.clone()
    backend.reshape_and_cache(key, value, kc, vc, slots)
    keep = slots >= 0
    ref_k = torch.full_like(kc, float("nan"))
    ref_v = ref_k.clone()
    ref_k.view(-1, hkv, d)[slots[keep]] = key[keep]
    ref_v.view(-1, hkv, d)[slots[keep]] = value[keep]
    assert torch.equal(kc.nan_to_num(7.0), ref_k.nan_to_num(7.0))
    assert torch.equal(vc.nan_to_num(7.0), ref_v.nan_to_num(7.0))


def test_padding_rows_are_zeros(backend):
    assert gc.check_padding_rows(backend, "cpu", seed=6)["ok"]


def test_rows_outside_the_batch_are_left_alone(backend):
    """A step's output rows past query_start_loc[B] (and before [0]) keep their
    contents: the kernels write only the rows they own."""
    c = gc.make_attention_case(CASES[10], "cpu", seed=8)
    qsl = c["query_start_loc"]
    c["query_start_loc"] = qsl + 2
    t, hq, d = c["query"].shape
    query = torch.randn(t + 4, hq, d).to(c["query"].dtype)
    query[2: t + 2] = c["query"]
    out = torch.full((t + 4, hq, d), 3.0, dtype=query.dtype)
    backend.paged_attention(query, c["key_cache"], c["value_cache"], c["block_tables"],
                            c["seq_lens"], c["query_start_loc"], c["scale"], out=out)
    assert (out[:2] == 3.0).all() and (out[t + 2:] == 3.0).all()
    res = gc.compare(out[2: t + 2], case_reference({**c, "query_start_loc": qsl}))
    assert res["finite"] and res["rel_err"] < 1e-2, res


def test_the_emulation_takes_only_the_cuda_dtypes(backend):
    q = torch.zeros(1, 8, 64)
    cache = torch.zeros(1, 16, 8, 64)
    idx = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="query must be float16 or bfloat16"):
        backend.paged_attention(q, cache, cache, idx, idx[0], torch.zeros(2, dtype=torch.int32),
                                0.1)


def test_unsupported_head_size_is_a_value_error(backend):
    q = torch.zeros(1, 2, 96, dtype=torch.bfloat16)
    cache = torch.zeros(1, 16, 2, 96, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="head_size must be 64, 128 or 256"):
        backend.paged_attention(q, cache, cache, idx, torch.ones(1, dtype=torch.int32),
                                torch.tensor([0, 1], dtype=torch.int32), 0.1)


def test_the_cpu_kernels_stay_the_cpu_default(backend):
    """An emulated backend is an object of its own: the dispatch still gives
    CPU tensors the C++ core (float32 and D=16, which the CUDA kernels refuse)."""
    assert isinstance(kernels.backend_for("cpu"), kernels.CpuBackend)
    q = torch.randn(1, 2, 16)
    cache = torch.randn(1, 16, 2, 16)
    kernels.paged_attention(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32),
                            torch.ones(1, dtype=torch.int32),
                            torch.tensor([0, 1], dtype=torch.int32), 0.25)
    assert backend.module.emu_stats()["launches"] == 0


def test_alloc_decode_workspace_under_emulation(backend):
    ws = backend.alloc_decode_workspace("cpu", 8, 32, 8, 128, 8192)
    assert ws is not None and ws.dtype == torch.uint8
    assert ws.numel() == backend.module.decode_workspace_bytes(8, 32, 8, 128, 8192, 132)


def test_model_path_matches_hf(backend):
    """The model runner's bf16 forward with the CUDA attention kernels (emulated)
    against HF's float32 forward of the same weights: prefill, then decodes."""
    res = gc.check_model_path(seed=2, steps=4, device="cpu", attn_ops=backend)
    assert res["ok"], res
    assert backend.module.emu_stats()["launches"] > 0


def _decode_case(table, seq_len, num_blocks=8):
    q = torch.randn(1, 4, 64).to(torch.bfloat16)
    cache = torch.randn(num_blocks, 16, 2, 64).to(torch.bfloat16)
    return (q, cache, cache.clone(), torch.tensor([table], dtype=torch.int32),
            torch.tensor([seq_len], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
            0.125)


@pytest.mark.parametrize("table, seq_len, qsl, max_query_len, message", [
    ([10_000_000, 1], 10, [0, 1], None, r"block_tables\[0, 0\] = 10000000 out of range"),
    ([-1, 1], 10, [0, 1], None, r"block_tables\[0, 0\] = -1 out of range"),
    ([0, 1], 40, [0, 1], None, "exceeds max_blocks_per_seq"),
    ([0, 1], 10 ** 6, [0, 1], None, "exceeds max_blocks_per_seq"),
    ([0, 1], 10, [0, 5], None, r"within \[0, 1\]"),
    ([0, 1], 10, [1, 0], None, r"within|non-decreasing"),
])
def test_index_contents_are_checked_as_on_the_cpu_path(backend, table, seq_len, qsl, max_query_len,
                                                       message):
    """The emulation reads host memory: a bad index is a ValueError, not a
    read outside a tensor (on a GPU index contents are trusted)."""
    q, kc, vc, bt, sl, _, scale = _decode_case(table, seq_len)
    with pytest.raises(ValueError, match=message):
        backend.paged_attention(q, kc, vc, bt, sl, torch.tensor(qsl, dtype=torch.int32), scale,
                                max_query_len=max_query_len)
    assert backend.module.emu_stats()["launches"] == 0  # refused before any launch


def test_a_prefill_shorter_than_its_query_or_its_hint_is_refused(backend):
    q = torch.randn(5, 4, 64).to(torch.bfloat16)
    cache = torch.randn(4, 16, 2, 64).to(torch.bfloat16)
    table, qsl = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 3 is below its query length 5"):
        backend.paged_attention(q, cache, cache, table, torch.tensor([3], dtype=torch.int32), qsl,
                                0.125)
    with pytest.raises(ValueError, match="max_query_len = 1 is below the longest query"):
        backend.paged_attention(q, cache, cache, table, torch.tensor([8], dtype=torch.int32), qsl,
                                0.125, max_query_len=1)  # its rows would be left unwritten


def test_unchecked_emulation_has_the_gpu_semantics_for_slots():
    """check_indices=False: the kernel itself skips a slot past the cache."""
    key = torch.randn(2, 2, 64).to(torch.bfloat16)
    kc = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16)
    vc = kc.clone()
    slots = torch.tensor([3, 32], dtype=torch.int64)
    with pytest.raises(ValueError, match="slot 32 out of range"):
        kernels.emulated_cuda_backend().reshape_and_cache(key, key, kc, vc, slots)
    kernels.emulated_cuda_backend(check_indices=False).reshape_and_cache(key, key, kc, vc, slots)
    assert torch.equal(kc.view(-1, 2, 64)[3], key[0])
    assert int((kc != 0).any(-1).any(-1).sum()) == 1  # slot 3 only


def test_workspace_sizes_are_refused_like_the_kernels_refuse_them(backend):
    with pytest.raises(ValueError, match="head_size must be 64, 128 or 256"):
        backend.alloc_decode_workspace("cpu", 8, 32, 8, 96, 4096)
    with pytest.raises(ValueError, match="max_num_seqs must be <= 65535"):
        backend.alloc_decode_workspace("cpu", 100_000, 32, 8, 128, 4096)
