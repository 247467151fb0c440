"""Sliding-window attention in the CUDA kernels (decode with and without
split-K, prefill over cached context) against the suite's float64 reference
(tests/paged_attention_ref.py), under the CPU emulation of the CUDA execution
model and, where there is one, on a GPU. Table entries of blocks wholly
before a sequence's first window are -1 (blocks a cache manager freed): the
kernels must neither read them nor, under the emulation's index checks, refuse
them; pointed at a block of NaNs instead, no NaN may reach the output."""

from __future__ import annotations

import pytest
import torch

from paternoster import kernels

from ..paged_attention_ref import paged_attention_reference
from .conftest import cuda_ready

TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # relative to max |reference|

PLACES = [
    pytest.param("emulated", marks=pytest.mark.skipif(
        not kernels.cuda_emulation_available(),
        reason="paternoster._cuda_emu not built (needs the CUDA toolkit)")),
    pytest.param("gpu", marks=pytest.mark.skipif(not cuda_ready(),
                                                 reason="needs a CUDA GPU and _cuda_ops")),
]


@pytest.fixture(params=PLACES)
def place(request):
    """(attention function, device): the emulated backend on CPU tensors, or
    the dispatching paged_attention on a GPU."""
    if request.param == "gpu":
        return kernels.paged_attention, "cuda"
    return kernels.emulated_cuda_backend().paged_attention, "cpu"


def make_case(q_lens, context_lens, hq, hkv, d, bs, dtype, window, seed=0, freed=-1):
    """Random cache and queries (shuffled block tables, out-of-window entries
    ``freed``: -1, or None for an extra block full of NaNs); returns the kernel
    arguments on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    q_lens, context_lens = list(q_lens), list(context_lens)
    seq_lens = [q + c for q, c in zip(q_lens, context_lens, strict=True)]
    blocks = [-(-n // bs) for n in seq_lens]
    num_blocks = sum(blocks) + 3
    perm = torch.randperm(num_blocks, generator=gen).int()
    tables = torch.zeros(len(q_lens), max(blocks) + 1, dtype=torch.int32)
    nan_block = int(perm[-1])  # in no table: they take perm[: sum(blocks)]
    used = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[used: used + n]
        used += n
        first = max(0, context_lens[b] - window + 1) // bs if window else 0
        tables[b, :first] = -1 if freed == -1 else nan_block
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    key_cache, value_cache = rand(num_blocks, bs, hkv, d), rand(num_blocks, bs, hkv, d)
    if freed is None:
        for cache in (key_cache, value_cache):
            cache[nan_block] = float("nan")
    return dict(query=rand(int(qsl[-1]), hq, d), key_cache=key_cache,
                value_cache=value_cache, block_tables=tables,
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_start_loc=qsl,
                scale=d ** -0.5)


def run(place, case, window, **hints):
    """The kernels on ``case`` (moved to the place's device); CPU output."""
    attend, device = place
    args = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    q_lens = case["query_start_loc"].diff()
    out = attend(**args, sliding_window=window, max_query_len=int(q_lens.max()),
                 max_seq_len=int(case["seq_lens"].max()), **hints)
    return out.cpu()


def assert_matches_reference(out, case, window):
    ref = paged_attention_reference(*(case[k] for k in (
        "query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc")),
        case["scale"], window)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert err < TOLERANCE[out.dtype], float(err)


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("window", [1, 7, 16, 45])
def test_decode_with_window(place, window, d):
    """Decodes of short and long contexts (block size 16, GQA 4): W below,
    equal to and not a multiple of the block size; head sizes 64 and 256
    (Gemma 3)."""
    case = make_case([1, 1, 1, 1], [0, 9, 300, 1000], 8, 2, d, 16, torch.bfloat16, window)
    assert_matches_reference(run(place, case, window), case, window)


@pytest.mark.parametrize("d", [128, 256])
def test_decode_split_k_inside_the_window(place, d):
    """W = 1100 over a 3000-token context: the window is split across thread
    blocks (decode_num_splits of a 1100-token context) and merged."""
    case = make_case([1, 1], [3000, 200], 32, 8, d, 16, torch.float16, 1100, seed=1)
    assert_matches_reference(run(place, case, 1100), case, 1100)


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("window", [3, 16, 50])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (16, 1)])
def test_prefill_chunks_with_window(place, window, heads, d):
    """A prompt longer than the window and chunks over cached context whose
    window boundary falls inside the chunk, with decodes in the same call;
    head sizes 64 and 256 (the prefill kernel's dynamic shared memory above
    48 KiB)."""
    case = make_case([70, 1, 40, 9], [0, 130, 90, 33], *heads, d, 8, torch.bfloat16, window,
                     seed=window)
    assert_matches_reference(run(place, case, window), case, window)


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("window", [5, 40])
def test_out_of_window_blocks_are_not_read(place, window, d):
    """Out-of-window entries point at a block of NaNs: nothing of it may
    reach the output (a masked key read would give 0 * NaN)."""
    case = make_case([1, 1, 30, 12], [250, 77, 64, 100], 8, 2, d, 16, torch.bfloat16, window,
                     seed=6, freed=None)
    assert_matches_reference(run(place, case, window), case, window)


def test_split_count_follows_the_window():
    """The decode splits a 3000-token context's 1100-token window in 9
    (decode_num_splits of 1100 tokens), not in the 24 of the whole context."""
    if not kernels.cuda_emulation_available():
        pytest.skip("paternoster._cuda_emu not built")
    backend = kernels.emulated_cuda_backend()
    assert backend.module.decode_num_splits(2, 32, 8, 1100, 132) == 9
    assert backend.module.decode_num_splits(2, 32, 8, 3001, 132) == 24
    case = make_case([1, 1], [3000, 200], 32, 8, 128, 16, torch.float16, 1100, seed=1)
    backend.module.emu_stats(True)
    backend.paged_attention(**case, sliding_window=1100, max_query_len=1, max_seq_len=3001)
    # decode grid: 8 kv heads x 2 sequences x 9 splits, + 2 x 32 reduction blocks
    assert backend.module.emu_stats()["blocks"] == 16 * 9 + 2 * 32


def test_window_covering_the_context_is_full_attention(place):
    case = make_case([33, 1, 5], [0, 150, 60], 8, 2, 128, 16, torch.bfloat16, 0, seed=4)
    full = run(place, case, 0)
    assert torch.equal(run(place, case, int(case["seq_lens"].max())), full)
    assert torch.equal(run(place, case, 2**40), full)
    assert torch.equal(run(place, case, 2**63 - 1), full)
    assert_matches_reference(full, case, 0)


def test_blocks_in_the_window_are_still_checked():
    """Under the emulation's index checks a -1 the window reaches is refused."""
    if not kernels.cuda_emulation_available():
        pytest.skip("paternoster._cuda_emu not built")
    case = make_case([1], [40], 8, 2, 64, 16, torch.bfloat16, 20)  # positions 21..40 seen
    backend = kernels.emulated_cuda_backend()
    assert_matches_reference(backend.paged_attention(**case, sliding_window=20), case, 20)
    case["block_tables"][0, 1] = -1  # positions 16..31
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\] = -1"):
        backend.paged_attention(**case, sliding_window=20)
    with pytest.raises(ValueError, match="sliding_window"):
        backend.paged_attention(**case, sliding_window=-2)
    with pytest.raises(ValueError, match="sliding_window"):
        backend.module.paged_attention(*[0] * 7, 1, 1, 8, 2, 64, 1, 16, 1, 0, 0, 1, 16, 0.1,
                                       backend.module.DType.bfloat16, 0, 0, 132, 0, 0, -1)


@pytest.mark.parametrize("d", [128, 256])
def test_shuffled_thread_orders_give_identical_results_with_window(d):
    if not kernels.cuda_emulation_available():
        pytest.skip("paternoster._cuda_emu not built")
    case = make_case([37, 1, 1], [100, 700, 20], 8, 2, d, 16, torch.bfloat16, 150, seed=5)
    outs = [kernels.emulated_cuda_backend(schedule_seed=s).paged_attention(
        **case, sliding_window=150, max_seq_len=800) for s in (0, 1, 0x9E3779B97F4A7C15)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert_matches_reference(outs[0], case, 150)
