"""CPU checks of the CUDA build: where nvcc is present the CMake build must have
produced paternoster._cuda_ops (so a CUDA compile error fails CI), and the
module, linked with the static CUDA runtime, imports and validates arguments
without a GPU."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from paternoster import kernels

HAVE_NVCC = bool(shutil.which("nvcc") or os.environ.get("CUDACXX"))


@pytest.mark.skipif(not HAVE_NVCC, reason="no CUDA compiler (nvcc) on this machine")
def test_cuda_extension_is_built_when_nvcc_is_present():
    from paternoster import _cuda_ops

    backend = kernels.backend_for("cuda")
    assert isinstance(backend, kernels.CudaBackend) and backend.module is _cuda_ops


@pytest.fixture
def cuda_ops():
    try:
        from paternoster import _cuda_ops
    except ImportError:
        pytest.skip("paternoster._cuda_ops not built")
    return _cuda_ops


def _attention_args(cuda_ops, head_size=128):
    # fake, 16-byte aligned addresses: validation fails (or the CUDA call does)
    # before anything is dereferenced
    p = 1 << 20
    return dict(out=p, query=p, key_cache=p, value_cache=p, block_tables=p, seq_lens=p,
                query_start_loc=p, num_tokens=4, num_seqs=4, num_heads=32, num_kv_heads=8,
                head_size=head_size, num_blocks=10, block_size=16, max_blocks_per_seq=4,
                query_stride=0, out_stride=0, max_query_len=1, max_seq_len=0, scale=0.1,
                dtype=cuda_ops.DType.bfloat16, workspace=0, workspace_bytes=0, num_sms=0,
                device=0, stream=0)


def test_the_extension_counts_the_gpus_torch_sees(cuda_ops):
    """Imports without a GPU (static CUDA runtime) and reports no device
    where there is none, rather than raising."""
    assert cuda_ops.device_count() == torch.cuda.device_count()


def test_unsupported_sizes_are_value_errors_before_any_cuda_call(cuda_ops):
    with pytest.raises(ValueError, match="head_size must be 64, 128 or 256"):
        cuda_ops.paged_attention(**_attention_args(cuda_ops, head_size=96))
    args = _attention_args(cuda_ops)
    args["block_size"] = 12
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        cuda_ops.paged_attention(**args)


def test_a_call_without_a_gpu_is_a_clear_runtime_error(cuda_ops):
    if cuda_ops.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="CUDA error"):
        cuda_ops.paged_attention(**_attention_args(cuda_ops))


def test_split_plan_and_workspace_size(cuda_ops):
    assert cuda_ops.decode_num_splits(512, 32, 8, 2048, 132) == 1
    assert 1 < cuda_ops.decode_num_splits(1, 32, 8, 32768, 132) <= cuda_ops.MAX_SPLITS
    nbytes = cuda_ops.decode_workspace_bytes(256, 32, 8, 128, 4096, 132)
    z = cuda_ops.decode_num_splits(64, 32, 8, 4096, 132)
    assert nbytes >= 64 * 32 * z * (128 + 2) * 4
