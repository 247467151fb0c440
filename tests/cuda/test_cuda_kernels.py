"""The CUDA kernels against the suite's float64 reference
(tests/paged_attention_ref.py) through the checks of bench/gpu_check.py's
correctness phase: fresh random inputs per case, NaN in the output and in
unused KV cache slots beforehand, relative L2 error below the dtype's
tolerance, every output row finite and non-zero. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels

from .conftest import case_reference, check_attention_case, load_gpu_check, requires_gpu

gc = load_gpu_check()

pytestmark = [pytest.mark.gpu, requires_gpu]


@pytest.mark.parametrize("case", gc.CASES, ids=[c.name for c in gc.CASES])
def test_paged_attention_matches_reference(case):
    res = check_attention_case(case, "cuda", seed=torch.seed() % 2**31, ops_module=kernels)
    assert res["finite"], res
    assert res["zero_rows"] == 0, res
    assert res["rel_err"] < res["tol"], res


@pytest.mark.parametrize("case", [c for c in gc.CASES if c.dtype == torch.bfloat16][:3],
                         ids=lambda c: c.name)
def test_float16_variant_matches_reference(case):
    res = check_attention_case(case, "cuda", seed=3, ops_module=kernels, dtype=torch.float16)
    assert res["ok"], res


@pytest.mark.parametrize("workspace_bytes", [0, 64 * 1024])
def test_split_k_agrees_with_fewer_splits(workspace_bytes):
    """Without (or with too little) workspace the decode kernel splits less: same result."""
    ws = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda")
    res = check_attention_case(gc.CASES[2], "cuda", seed=11, ops_module=kernels, workspace=ws)
    assert res["ok"], res


def test_without_kernel_hints_matches_reference():
    """Default max_query_len (T) / max_seq_len (table width): both kernels launched."""
    res = check_attention_case(gc.CASES[10], "cuda", seed=12, ops_module=kernels,
                                  kernel_hints=False)
    assert res["ok"], res


def test_reshape_and_cache_writes_only_valid_slots():
    assert gc.check_reshape_and_cache(kernels, "cuda", seed=5)["ok"]


def test_decode_rows_with_zero_seq_len_are_zeros():
    assert gc.check_padding_rows(kernels, "cuda", seed=6)["ok"]


def test_decode_replays_in_a_cuda_graph():
    res = gc.check_graph_replay(kernels, "cuda", seed=7, reference=case_reference)
    assert res["ok"], res


def test_float32_is_rejected_on_cuda():
    q = torch.zeros(1, 8, 64, device="cuda")
    cache = torch.zeros(1, 16, 8, 64, device="cuda")
    idx = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="query must be float16 or bfloat16"):
        kernels.paged_attention(q, cache, cache, idx, idx[0], torch.zeros(2, dtype=torch.int32,
                                                                      device="cuda"), 0.1)


def test_model_path_with_graphs_matches_hf():
    """ModelRunner on cuda (bf16, CUDA graphs) over a tiny random Llama vs HF."""
    res = gc.check_model_path(seed=1)
    assert res["ok"] and res["graphs"], res
