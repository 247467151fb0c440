"""The CUDA backend of paternoster.kernels on a CPU: argument validation with
CUDA's dtypes (on meta tensors, which carry shape, dtype and device but no
data) and the backend's calls into a fake ``_cuda_ops`` (stream, device index,
kernel hints, split-K workspace)."""

from __future__ import annotations

import enum
from types import SimpleNamespace

import pytest
import torch

from paternoster import kernels
from paternoster.kernels import checks, dispatch

CUDA_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
META = torch.device("meta")


def attention_tensors(t=4, b=4, hq=32, hkv=8, d=128, blocks=10, bs=16, width=3,
                      dtype=torch.bfloat16, device=META):
    return dict(
        query=torch.empty(t, hq, d, dtype=dtype, device=device),
        key_cache=torch.empty(blocks, bs, hkv, d, dtype=dtype, device=device),
        value_cache=torch.empty(blocks, bs, hkv, d, dtype=dtype, device=device),
        block_tables=torch.empty(b, width, dtype=torch.int32, device=device),
        seq_lens=torch.empty(b, dtype=torch.int32, device=device),
        query_start_loc=torch.empty(b + 1, dtype=torch.int32, device=device),
    )


def check(**overrides):
    args = attention_tensors()
    out = overrides.pop("out", None)
    args.update(overrides)
    return checks.check_attention(*args.values(), out, CUDA_DTYPES)


def test_valid_arguments_give_the_sizes():
    assert tuple(check()) == (4, 4, 32, 8, 128, 10, 16, 3)


def test_float32_is_rejected_with_the_cuda_dtypes_named():
    t = attention_tensors(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"query must be float16 or bfloat16 on meta"):
        checks.check_attention(*t.values(), None, CUDA_DTYPES)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=META)


@pytest.mark.parametrize("name, bad, message", [
    ("block_tables", meta(4, 3, dtype=torch.int64), "block_tables must be torch.int32"),
    ("seq_lens", meta(5, dtype=torch.int32), "seq_lens has 5 entries"),
    ("query_start_loc", meta(4, dtype=torch.int32), "B \\+ 1 = 5"),
    ("key_cache", meta(10, 16, 8, 64), "value_cache shape"),
    ("value_cache", meta(10, 16, 8, 128, dtype=torch.float16), "value_cache must be torch.bf"),
    ("seq_lens", torch.empty(4, dtype=torch.int32), "seq_lens is on cpu, expected meta"),
    ("query", meta(4, 128, 32).transpose(1, 2), "query must be contiguous"),
    ("query", meta(4, 30, 128), "multiple of key_cache kv heads"),
])  # fmt: skip
def test_bad_arguments_are_named(name, bad, message):
    with pytest.raises(ValueError, match=message):
        check(**{name: bad})


def test_out_must_match_the_query():
    with pytest.raises(ValueError, match="out shape"):
        check(out=torch.empty(4, 32, 64, dtype=torch.bfloat16, device=META))


def test_cache_write_checks_use_the_cuda_dtypes():
    key = torch.empty(3, 8, 128, dtype=torch.float32, device=META)
    cache = torch.empty(10, 16, 8, 128, dtype=torch.float32, device=META)
    slots = torch.empty(3, dtype=torch.int64, device=META)
    with pytest.raises(ValueError, match="key must be float16 or bfloat16"):
        checks.check_cache_write(key, key, cache, cache, slots, CUDA_DTYPES)
    key, cache = key.bfloat16(), cache.bfloat16()
    assert tuple(checks.check_cache_write(key, key, cache, cache, slots, CUDA_DTYPES)) == (
        3, 8, 128, 160)


class FakeCudaOps:
    """Records the calls the CUDA backend makes."""

    class DType(enum.Enum):
        float16 = 0
        bfloat16 = 1

    def __init__(self, workspace_bytes=4096):
        self.calls = []
        self.workspace_bytes = workspace_bytes

    def paged_attention(self, *args):
        self.calls.append(("paged_attention", args))

    def reshape_and_cache(self, *args):
        self.calls.append(("reshape_and_cache", args))

    def decode_workspace_bytes(self, *args):
        self.calls.append(("decode_workspace_bytes", args))
        return self.workspace_bytes


ATTN_FIELDS = ("out", "query", "key_cache", "value_cache", "block_tables", "seq_lens",
               "query_start_loc", "num_tokens", "num_seqs", "num_heads", "num_kv_heads",
               "head_size", "num_blocks", "block_size", "max_blocks_per_seq", "query_stride",
               "out_stride", "max_query_len", "max_seq_len", "scale", "dtype", "workspace",
               "workspace_bytes", "num_sms", "device", "stream", "sliding_window", "sinks")


@pytest.fixture
def fake():
    """A CUDA backend over FakeCudaOps, for meta tensors."""
    return kernels.CudaBackend(FakeCudaOps(), stream=lambda device: 0xBEEF,
                               num_sms=lambda device: 132)


def last_call(backend, name):
    kind, args = [c for c in backend.module.calls if c[0] == name][-1]
    return SimpleNamespace(**dict(zip(ATTN_FIELDS, args))) if name == "paged_attention" else args


def test_backend_passes_stream_device_and_defaults(fake):
    t = attention_tensors()
    out = fake.paged_attention(*t.values(), 0.125)
    assert out.shape == t["query"].shape and out.device == META
    call = last_call(fake, "paged_attention")
    assert call.stream == 0xBEEF and call.device == 0 and call.num_sms == 132
    assert call.dtype is FakeCudaOps.DType.bfloat16
    assert (call.num_tokens, call.num_seqs, call.num_heads, call.num_kv_heads) == (4, 4, 32, 8)
    assert call.max_query_len == 4  # default: T, both kernels
    assert call.max_seq_len == 3 * 16  # default: table width * block size
    assert call.workspace_bytes == 4096  # none given: one allocated for this batch
    assert call.scale == 0.125


def test_backend_passes_the_sliding_window(fake):
    t = attention_tensors()
    fake.paged_attention(*t.values(), 0.125)
    assert last_call(fake, "paged_attention").sliding_window == 0
    fake.paged_attention(*t.values(), 0.125, sliding_window=4096)
    assert last_call(fake, "paged_attention").sliding_window == 4096
    with pytest.raises(ValueError, match="sliding_window"):
        fake.paged_attention(*t.values(), 0.125, sliding_window=-1)


def test_backend_passes_the_sinks_address(fake):
    t = attention_tensors()
    fake.paged_attention(*t.values(), 0.125)
    assert last_call(fake, "paged_attention").sinks == 0
    sinks = torch.empty(32, device=META)  # float32 [Hq] on the query's device
    fake.paged_attention(*t.values(), 0.125, sinks=sinks)
    assert last_call(fake, "paged_attention").sinks == sinks.data_ptr()
    for bad in (torch.empty(8, device=META), torch.empty(32, dtype=torch.bfloat16, device=META),
                torch.empty(32)):
        with pytest.raises(ValueError, match="sinks"):
            fake.paged_attention(*t.values(), 0.125, sinks=bad)


def test_backend_uses_the_callers_hints_and_workspace(fake):
    t = attention_tensors()
    ws = torch.empty(1000, dtype=torch.uint8, device=META)
    fake.paged_attention(*t.values(), 0.1, max_query_len=1, max_seq_len=40, workspace=ws)
    call = last_call(fake, "paged_attention")
    assert (call.max_query_len, call.max_seq_len, call.workspace_bytes) == (1, 40, 1000)
    assert not [c for c in fake.module.calls if c[0] == "decode_workspace_bytes"]


def test_backend_without_splits_allocates_nothing(fake):
    fake.module.workspace_bytes = 0
    fake.paged_attention(*attention_tensors().values(), 0.1)
    call = last_call(fake, "paged_attention")
    assert (call.workspace, call.workspace_bytes) == (0, 0)


def test_backend_cache_write(fake):
    key = torch.empty(3, 8, 128, dtype=torch.float16, device=META)
    cache = torch.empty(10, 16, 8, 128, dtype=torch.float16, device=META)
    fake.reshape_and_cache(key, key, cache, cache, torch.empty(3, dtype=torch.int64, device=META))
    args = last_call(fake, "reshape_and_cache")
    # (..., num_tokens, Hkv, D, key_stride, value_stride, num_slots, dtype, device, stream)
    assert args[5:] == (3, 8, 128, 0, 0, 160, FakeCudaOps.DType.float16, 0, 0xBEEF)


def test_cuda_without_the_extension_fails_loudly(monkeypatch):
    """No silent fallback: a CUDA device without ``_cuda_ops`` is a ValueError."""
    monkeypatch.setattr(dispatch, "load_cuda_ops", lambda: None)
    with pytest.raises(ValueError, match="not built"):
        dispatch._backend_for_type.__wrapped__("cuda")


def test_only_the_cuda_backend_has_a_workspace():
    with pytest.raises(ValueError, match="no CUDA kernels"):
        kernels.alloc_decode_workspace("cpu", 8, 32, 8, 128, 4096)


def test_cpu_path_ignores_the_cuda_hints():
    t = attention_tensors(t=2, b=2, hq=4, hkv=2, d=16, blocks=4, bs=8, width=2,
                          dtype=torch.float32, device=torch.device("cpu"))
    t["block_tables"].copy_(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    t["seq_lens"].copy_(torch.tensor([9, 16], dtype=torch.int32))
    t["query_start_loc"].copy_(torch.tensor([0, 1, 2], dtype=torch.int32))
    for name in ("query", "key_cache", "value_cache"):
        t[name].normal_()
    plain = kernels.paged_attention(*t.values(), 0.25)
    hinted = kernels.paged_attention(*t.values(), 0.25, max_query_len=1, max_seq_len=16,
                                     workspace=torch.empty(8, dtype=torch.uint8))
    assert torch.equal(plain, hinted)
