"""paternoster.kernels.paged_attention / reshape_and_cache on the CPU against
the suite's float64 paged-attention reference (tests/paged_attention_ref.py)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from paternoster import _core, kernels

from ..paged_attention_ref import paged_attention_reference

F32_TOL = 1e-5  # absolute, outputs are O(1)
BF16_TOL = 2e-2  # relative to max |reference|; bf16 output rounding is 2^-8 = 0.4 %


def reference_attention(q, k_cache, v_cache, block_tables, seq_lens, qsl, scale):
    """The shared reference on numpy arrays: float64 ``[T, Hq, D]``."""
    return paged_attention_reference(
        *(torch.from_numpy(np.asarray(x)) for x in (q, k_cache, v_cache, block_tables,
                                                    seq_lens, qsl)), scale).numpy()


def make_batch(rng, q_lens, context_lens, num_heads, num_kv_heads, head_size, block_size, dtype):
    """Random cache + queries. Sequence b has q_len new tokens after
    context_lens[b] cached ones; block tables are shuffled, non-contiguous."""
    seq_lens = np.asarray(q_lens) + np.asarray(context_lens)
    blocks_per_seq = -(-seq_lens // block_size)
    num_blocks = int(blocks_per_seq.sum()) + 5
    perm = rng.permutation(num_blocks).astype(np.int32)
    max_blocks = int(blocks_per_seq.max())
    tables = np.zeros((len(q_lens), max_blocks + 2), np.int32)  # extra unused columns
    used = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[used : used + n]
        used += n
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    t = int(qsl[-1])
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size).to(dtype)
    query = torch.randn(t, num_heads, head_size).to(dtype)
    return query, k_cache, v_cache, tables, seq_lens.astype(np.int32), qsl


def run_and_compare(rng, q_lens, context_lens, hq, hkv, d, bs, dtype):
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, q_lens, context_lens, hq, hkv, d, bs, dtype
    )
    scale = d**-0.5
    out = kernels.paged_attention(
        query,
        k_cache,
        v_cache,
        torch.from_numpy(tables),
        torch.from_numpy(seq_lens),
        torch.from_numpy(qsl),
        scale,
    )
    assert out.dtype == dtype and out.shape == query.shape
    ref = reference_attention(
        query.float().numpy(),
        k_cache.float().numpy(),
        v_cache.float().numpy(),
        tables,
        seq_lens,
        qsl,
        scale,
    )
    got = out.float().numpy()
    if dtype == torch.float32:
        np.testing.assert_allclose(got, ref, atol=F32_TOL, rtol=0)
    else:
        assert np.abs(got - ref).max() <= BF16_TOL * np.abs(ref).max()


# q_lens / context_lens: a whole prompt (context 0), prefill chunks over cached
# context, and decodes (q_len 1), all in one call.
MIXED = ([1, 57, 1, 24, 1, 130, 3], [0, 0, 200, 40, 77, 16, 9])


@pytest.mark.parametrize("heads", [(8, 2), (9, 3), (4, 4), (6, 1)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_mixed_batch(heads, block_size, dtype):
    rng = np.random.default_rng()
    hq, hkv = heads
    run_and_compare(rng, *MIXED, hq, hkv, 64, block_size, dtype)


@pytest.mark.parametrize("head_size", [32, 40, 128])
def test_other_head_sizes(head_size):
    rng = np.random.default_rng()
    run_and_compare(rng, [1, 20, 2], [33, 0, 17], 8, 2, head_size, 16, torch.float32)


def test_random_lengths():
    rng = np.random.default_rng()
    for _ in range(5):
        b = int(rng.integers(1, 9))
        q_lens = rng.integers(1, 40, b) * (rng.random(b) < 0.5) + 1
        context = rng.integers(0, 150, b)
        run_and_compare(rng, q_lens, context, 9, 3, 64, int(rng.choice([8, 16, 32])), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_threads(dtype):
    rng = np.random.default_rng()
    _core.set_num_threads(2)
    try:
        assert _core.get_num_threads() == 2
        run_and_compare(rng, *MIXED, 9, 3, 64, 16, dtype)
    finally:
        _core.set_num_threads(1)


def test_out_argument_is_filled_and_returned():
    rng = np.random.default_rng()
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, [3, 1], [5, 9], 4, 2, 64, 16, torch.float32
    )
    out = torch.full_like(query, 7.0)
    args = (torch.from_numpy(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl))
    res = kernels.paged_attention(query, k_cache, v_cache, *args, 0.125, out=out)
    assert res is out
    np.testing.assert_allclose(
        out.numpy(),
        kernels.paged_attention(query, k_cache, v_cache, *args, 0.125).numpy(),
        rtol=0,
        atol=0,
    )


def test_long_context_decode():
    rng = np.random.default_rng()
    run_and_compare(rng, [1, 1], [4000, 2500], 8, 2, 64, 16, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_writes_only_mapped_slots(dtype):
    num_blocks, block_size, hkv, d, t = 6, 8, 3, 16, 10
    key = torch.randn(t, hkv, d).to(dtype)
    value = torch.randn(t, hkv, d).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, hkv, d).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, hkv, d).to(dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    slots = torch.from_numpy(np.random.default_rng().permutation(num_blocks * block_size)[:t])
    slots[3] = -1  # skipped
    kernels.reshape_and_cache(key, value, k_cache, v_cache, slots)
    k_flat, v_flat = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    written = set()
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        written.add(s)
        assert torch.equal(k_flat[s], key[i]) and torch.equal(v_flat[s], value[i])
    untouched = [s for s in range(num_blocks * block_size) if s not in written]
    assert torch.equal(k_flat[untouched], k_before.view(-1, hkv, d)[untouched])
    assert torch.equal(v_flat[untouched], v_before.view(-1, hkv, d)[untouched])


def test_reshape_then_attend_round_trip():
    """Filling the cache with reshape_and_cache from BatchBuilder's slot mapping
    gives the same attention as the reference over the written K/V."""
    kv = _core.KVCacheManager(32, 16)
    builder = _core.BatchBuilder(kv)
    lens = [5, 40]
    for rid, n in enumerate(lens):
        builder.add_request(rid, list(range(n)))
        assert kv.allocate_slots(rid, n)
    batch = builder.build([0, 1], [0, 0], lens)
    t = sum(lens)
    key, value, query = torch.randn(t, 2, 32), torch.randn(t, 2, 32), torch.randn(t, 4, 32)
    k_cache, v_cache = torch.zeros(32, 16, 2, 32), torch.zeros(32, 16, 2, 32)
    kernels.reshape_and_cache(key, value, k_cache, v_cache, torch.from_numpy(batch["slot_mapping"]))
    out = kernels.paged_attention(
        query,
        k_cache,
        v_cache,
        torch.from_numpy(batch["block_tables"]),
        torch.from_numpy(batch["seq_lens"]),
        torch.from_numpy(batch["query_start_loc"]),
        32**-0.5,
    )
    ref = reference_attention(
        query.numpy(),
        k_cache.numpy(),
        v_cache.numpy(),
        batch["block_tables"],
        batch["seq_lens"],
        batch["query_start_loc"],
        32**-0.5,
    )
    np.testing.assert_allclose(out.numpy(), ref, atol=F32_TOL, rtol=0)


# ------------------------------------------------------------------ errors


@pytest.fixture
def good_args():
    rng = np.random.default_rng(0)
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, [2, 1], [3, 4], 4, 2, 16, 8, torch.float32
    )
    return dict(
        query=query,
        key_cache=k_cache,
        value_cache=v_cache,
        block_tables=torch.from_numpy(tables),
        seq_lens=torch.from_numpy(seq_lens),
        query_start_loc=torch.from_numpy(qsl),
        scale=0.25,
    )


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("query", lambda a: a["query"].to(torch.float16)),
        ("query", lambda a: a["query"][:, :, :8]),  # non-contiguous
        ("query", lambda a: a["query"].flatten(1)),  # 2-D
        ("key_cache", lambda a: a["key_cache"].to(torch.bfloat16)),
        ("value_cache", lambda a: a["value_cache"][:, :, :1].contiguous()),
        ("block_tables", lambda a: a["block_tables"].long()),
        ("seq_lens", lambda a: a["seq_lens"].long()),
        ("query_start_loc", lambda a: a["query_start_loc"].float()),
        ("query_start_loc", lambda a: a["query_start_loc"][:-1]),
        ("block_tables", lambda a: a["block_tables"][:1]),
        ("query", lambda a: a["query"].numpy()),
    ],
)
def test_paged_attention_rejects_bad_argument(good_args, name, bad):
    args = dict(good_args)
    args[name] = bad(args)
    with pytest.raises(ValueError, match=name):
        kernels.paged_attention(**args)


def test_paged_attention_rejects_bad_values(good_args):
    args = dict(good_args)
    args["block_tables"] = args["block_tables"].clone()
    args["block_tables"][0, 0] = args["key_cache"].shape[0]
    with pytest.raises(ValueError, match="block_tables"):
        kernels.paged_attention(**args)
    args = dict(good_args)
    args["seq_lens"] = torch.tensor([1, 5], dtype=torch.int32)  # < q_len 2
    with pytest.raises(ValueError, match="seq_lens"):
        kernels.paged_attention(**args)
    args = dict(good_args)
    with pytest.raises(ValueError, match="out"):
        kernels.paged_attention(**args, out=torch.empty(3, 4, 8))
    with pytest.raises(ValueError, match="query heads"):
        kernels.paged_attention(**{**args, "query": torch.randn(3, 3, 16)})


def test_reshape_and_cache_rejects_bad_arguments():
    key, value = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    k_cache, v_cache = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    slots = torch.arange(4)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.reshape_and_cache(key, value, k_cache, v_cache, slots.int())
    with pytest.raises(ValueError, match="value"):
        kernels.reshape_and_cache(key, value.bfloat16(), k_cache, v_cache, slots)
    with pytest.raises(ValueError, match="key_cache"):
        kernels.reshape_and_cache(key, value, torch.zeros(3, 4, 1, 8), v_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        kernels.reshape_and_cache(key, value, k_cache, v_cache, torch.tensor([0, 1, 2, 12]))
    assert k_cache.abs().sum() == 0  # nothing written on error
    with pytest.raises(ValueError, match="key"):
        kernels.reshape_and_cache(key.transpose(0, 1), value, k_cache, v_cache, slots)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_thread_pool_survives_fork():
    """A child forked after the pool's workers started rebuilds them (no hang).
    The child only runs our kernel (no torch compute, which may not be fork safe)."""
    rng = np.random.default_rng()
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, *MIXED, 9, 3, 64, 16, torch.float32
    )
    meta = (torch.from_numpy(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl))
    ref = reference_attention(
        query.numpy(), k_cache.numpy(), v_cache.numpy(), tables, seq_lens, qsl, 0.125
    )
    out = torch.zeros_like(query)
    _core.set_num_threads(2)
    try:
        kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125, out=out)  # workers started
        pid = os.fork()
        if pid == 0:  # child: the exit code is the verdict
            code = 1
            try:
                out.numpy()[:] = 0  # numpy: torch ops may hang after fork
                kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125, out=out)
                code = 0 if np.abs(out.numpy() - ref).max() < F32_TOL else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("attention hung in a forked child")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        _core.set_num_threads(1)


# ------------------------------------------------------------------ sliding window


def poison_out_of_window(tables, seq_lens, q_lens, block_size, window, value=-1):
    """Table entries of blocks wholly before the window of each sequence's
    first query row set to ``value`` (-1: what the KV cache manager writes for
    blocks it freed); returns how many were set."""
    poisoned = 0
    for b, (n, q) in enumerate(zip(seq_lens, q_lens, strict=True)):
        first = max(0, int(n) - int(q) - window + 1) // block_size
        tables[b, :first] = value
        poisoned += first
    return poisoned


def run_windowed(rng, q_lens, context_lens, hq, hkv, d, bs, dtype, window, poison="-1",
                 batch_invariant=False):
    """The kernel with ``sliding_window=window`` against the windowed reference;
    out-of-window table entries are -1 (``poison="-1"``), point at a block of
    NaNs that must not reach the output (``"nan"``), or stay (``None``).
    Returns the output."""
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, q_lens, context_lens, hq, hkv, d, bs, dtype
    )
    if poison == "-1":
        poison_out_of_window(tables, seq_lens, q_lens, bs, window)
    elif poison == "nan":  # make_batch leaves 5 blocks unused; the last one
        unused = sorted(set(range(k_cache.shape[0])) - set(tables[tables >= 0].tolist()))
        k_cache[unused[-1]] = float("nan")
        v_cache[unused[-1]] = float("nan")
        assert poison_out_of_window(tables, seq_lens, q_lens, bs, window, unused[-1]) > 0
    scale = d**-0.5
    out = kernels.paged_attention(query, k_cache, v_cache, torch.from_numpy(tables),
                                  torch.from_numpy(seq_lens), torch.from_numpy(qsl), scale,
                                  batch_invariant=batch_invariant, sliding_window=window)
    ref = paged_attention_reference(query.float(), k_cache.float(), v_cache.float(),
                                    torch.from_numpy(tables), torch.from_numpy(seq_lens),
                                    torch.from_numpy(qsl), scale, window).numpy()
    got = out.float().numpy()
    if dtype == torch.float32:
        np.testing.assert_allclose(got, ref, atol=F32_TOL, rtol=0)
    else:
        assert np.abs(got - ref).max() <= BF16_TOL * np.abs(ref).max()
    return out


# Decodes, a whole prompt longer than the window, and prefill chunks over cached
# context whose first rows' windows start in the cache and last rows' inside
# the chunk (W = 5 .. 100 against chunks of 3 .. 130 tokens).
WINDOW_MIXED = ([1, 57, 1, 24, 1, 130, 3, 1], [0, 0, 200, 40, 77, 16, 9, 300])


@pytest.mark.parametrize("window", [1, 5, 16, 37, 100])
@pytest.mark.parametrize("heads", [(8, 2), (9, 3), (4, 4), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_matches_reference(window, heads, dtype):
    """W smaller than, equal to and not a multiple of the block size; GQA
    groups that take the narrow and the wide path; out-of-window table
    entries -1."""
    rng = np.random.default_rng()
    run_windowed(rng, *WINDOW_MIXED, *heads, 64, 16, dtype, window)


@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("head_size", [40, 128])
def test_sliding_window_block_and_head_sizes(block_size, head_size):
    rng = np.random.default_rng()
    for window in (3, 19, 64):
        run_windowed(rng, *WINDOW_MIXED, 8, 2, head_size, block_size, torch.float32, window)
        run_windowed(rng, *WINDOW_MIXED, 8, 2, head_size, block_size, torch.bfloat16, window)


def test_sliding_window_random_lengths():
    rng = np.random.default_rng()
    for _ in range(8):
        b = int(rng.integers(1, 7))
        q_lens = rng.integers(1, 90, b) * (rng.random(b) < 0.5) + 1
        context = rng.integers(0, 200, b)
        window = int(rng.integers(1, 120))
        run_windowed(rng, q_lens, context, 6, 2, 64, int(rng.choice([8, 16, 32])),
                     torch.float32, window)


@pytest.mark.parametrize("heads", [(8, 2), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_out_of_window_blocks_are_not_read(heads, dtype):
    """Out-of-window entries point at a block of NaNs: a masked read of it
    would give 0 * NaN in the output."""
    rng = np.random.default_rng()
    for window in (1, 9, 40):
        run_windowed(rng, *WINDOW_MIXED, *heads, 64, 16, dtype, window, poison="nan")


def test_sliding_window_long_context_decode_skips_freed_blocks():
    """A 4000-token decode with W = 256: all but the last ~17 table entries -1."""
    rng = np.random.default_rng()
    run_windowed(rng, [1, 1, 1], [4000, 2500, 100], 8, 2, 64, 16, torch.float32, 256)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_covering_the_context_is_full_attention(dtype):
    """W >= every context: the same bits as no window (and the reference)."""
    rng = np.random.default_rng()
    q_lens, context = WINDOW_MIXED
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, q_lens, context, 9, 3, 64, 16, dtype)
    meta = (torch.from_numpy(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl))
    full = kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125)
    for window in (int(seq_lens.max()), int(seq_lens.max()) + 1, 2**40, 2**63 - 1):
        out = kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125,
                                      sliding_window=window)
        assert torch.equal(out, full)
    run_windowed(rng, q_lens, context, 9, 3, 64, 16, dtype, int(seq_lens.max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_two_threads(dtype):
    rng = np.random.default_rng()
    _core.set_num_threads(2)
    try:
        run_windowed(rng, *WINDOW_MIXED, 9, 3, 64, 16, dtype, 29)
    finally:
        _core.set_num_threads(1)


@pytest.mark.parametrize("heads", [(8, 2), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliding_window_batch_invariant_rows(heads, dtype):
    """batch_invariant with a window: every token's bits are the same whether
    it is decoded alone, prefilled in one chunk, or in chunks within a batch."""
    hq, hkv = heads
    d, bs, window, n = 64, 16, 21, 70
    rng = np.random.default_rng()
    num_blocks = 8
    k_cache = torch.randn(num_blocks, bs, hkv, d).to(dtype)
    v_cache = torch.randn(num_blocks, bs, hkv, d).to(dtype)
    table = torch.from_numpy(rng.permutation(num_blocks)[None, :].astype(np.int32))
    query = torch.randn(n, hq, d).to(dtype)

    def attend(rows, seq_len, tables=table):
        """Rows ``rows`` of ``query`` as the last len(rows) positions of a
        seq_len context."""
        qsl = torch.tensor([0, len(rows)], dtype=torch.int32)
        return kernels.paged_attention(query[rows], k_cache, v_cache, tables,
                                       torch.tensor([seq_len], dtype=torch.int32), qsl, 0.125,
                                       batch_invariant=True, sliding_window=window)

    whole = attend(list(range(n)), n)
    run_windowed(rng, [n], [0], hq, hkv, d, bs, dtype, window, batch_invariant=True)
    for p in (0, 5, 20, 21, 22, 47, n - 1):  # decoded alone, out-of-window entries -1
        poisoned = table.clone()
        poisoned[0, : max(0, p - window + 1) // bs] = -1
        assert torch.equal(attend([p], p + 1, poisoned)[0], whole[p])
    chunk = attend(list(range(30, 55)), 55)  # a chunk over cached context
    assert torch.equal(chunk, whole[30:55])
    # Inside a batch with other sequences (a decode and a chunk of another).
    rows = [40, 41, 42, 12, 66]
    qsl = torch.tensor([0, 3, 4, 5], dtype=torch.int32)
    tables = table.repeat(3, 1)
    seq_lens = torch.tensor([43, 13, 67], dtype=torch.int32)
    batched = kernels.paged_attention(query[rows], k_cache, v_cache, tables, seq_lens, qsl,
                                      0.125, batch_invariant=True, sliding_window=window)
    assert torch.equal(batched, whole[rows])


def test_sliding_window_still_checks_visible_blocks(good_args):
    args = dict(good_args)  # sequences: q_len 2 after 3 cached, a decode after 4; bs 8
    args["block_tables"] = args["block_tables"].clone()
    args["block_tables"][1, 0] = -1  # position 0..7: seen by the decode at 4
    with pytest.raises(ValueError, match="block_tables"):
        kernels.paged_attention(**args, sliding_window=2)


def test_sliding_window_rejects_negative(good_args):
    with pytest.raises(ValueError, match="sliding_window"):
        kernels.paged_attention(**good_args, sliding_window=-1)
    with pytest.raises(ValueError, match="sliding_window"):
        _core._paged_attention_ptr(0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 8, 1, 8, 1, 1.0,
                                   _core.DType.float32, False, -3)


def test_sliding_window_takes_integers_only(good_args):
    ref = kernels.paged_attention(**good_args, sliding_window=3)
    assert torch.equal(kernels.paged_attention(**good_args, sliding_window=np.int64(3)), ref)
    for bad in (2.5, "3", True):
        with pytest.raises(ValueError, match="sliding_window"):
            kernels.paged_attention(**good_args, sliding_window=bad)


# ------------------------------------------------------------------ attention sinks


def run_with_sinks(rng, q_lens, context_lens, hq, hkv, d, bs, dtype, sinks, window=0,
                   batch_invariant=False):
    """The kernel with ``sinks`` (float32 ``[hq]``) against the reference with
    the same sinks (and window); returns (output, float64 reference)."""
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, q_lens, context_lens, hq, hkv, d, bs, dtype
    )
    if window:
        poison_out_of_window(tables, seq_lens, q_lens, bs, window)
    meta = (torch.from_numpy(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl))
    scale = d**-0.5
    out = kernels.paged_attention(query, k_cache, v_cache, *meta, scale,
                                  batch_invariant=batch_invariant, sliding_window=window,
                                  sinks=sinks)
    ref = paged_attention_reference(query.float(), k_cache.float(), v_cache.float(), *meta,
                                    scale, window, sinks).numpy()
    got = out.float().numpy()
    if dtype == torch.float32:
        np.testing.assert_allclose(got, ref, atol=F32_TOL, rtol=0)
    else:
        assert np.abs(got - ref).max() <= BF16_TOL * max(np.abs(ref).max(), 1e-3)
    return out, ref


@pytest.mark.parametrize("window", [0, 5, 37])
@pytest.mark.parametrize("heads", [(8, 2), (9, 3), (4, 4), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_match_reference(window, heads, dtype):
    """Sinks of the logits' size on decodes, a prompt and prefill chunks; GQA
    groups on the narrow and the wide path; with and without a window."""
    rng = np.random.default_rng()
    sinks = torch.randn(heads[0]) * 2
    run_with_sinks(rng, *WINDOW_MIXED, *heads, 64, 16, dtype, sinks, window)


@pytest.mark.parametrize("head_size", [40, 128])
def test_sinks_other_head_and_block_sizes(head_size):
    rng = np.random.default_rng()
    for block_size, window in ((8, 0), (32, 19), (5, 3)):
        run_with_sinks(rng, *WINDOW_MIXED, 8, 2, head_size, block_size, torch.float32,
                       torch.randn(8), window)


@pytest.mark.parametrize("window", [0, 9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dominating_sinks_drive_the_output_to_zero(window, dtype):
    """A sink far above every logit takes almost all the probability: the
    rows of its heads are ~0, the others' are ordinary."""
    rng = np.random.default_rng()
    sinks = torch.tensor([60.0, 0.0, 60.0, -1.0, 60.0, 1.0, 60.0, 0.5, 60.0])
    out, ref = run_with_sinks(rng, *WINDOW_MIXED, 9, 3, 64, 16, dtype, sinks, window)
    assert out[:, 0::2].float().abs().max() < 1e-15
    assert np.abs(ref[:, 1::2]).max() > 0.1


@pytest.mark.parametrize("sink", [float("-inf"), -1e30, -1e4])
@pytest.mark.parametrize("heads", [(9, 3), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_very_negative_sinks_are_no_sinks(sink, heads, dtype):
    """exp(sink - max) is 0 in float32: the same bits as no sinks, batch
    invariant or not, windowed or not."""
    rng = np.random.default_rng()
    hq, hkv = heads
    query, k_cache, v_cache, tables, seq_lens, qsl = make_batch(
        rng, *WINDOW_MIXED, hq, hkv, 64, 16, dtype)
    meta = (torch.from_numpy(tables), torch.from_numpy(seq_lens), torch.from_numpy(qsl))
    sinks = torch.full((hq,), sink)
    for kw in ({}, {"batch_invariant": True}, {"sliding_window": 23}):
        plain = kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125, **kw)
        sunk = kernels.paged_attention(query, k_cache, v_cache, *meta, 0.125, sinks=sinks, **kw)
        assert torch.equal(plain, sunk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_two_threads(dtype):
    rng = np.random.default_rng()
    _core.set_num_threads(2)
    try:
        run_with_sinks(rng, *WINDOW_MIXED, 9, 3, 64, 16, dtype, torch.randn(9), 29)
        run_with_sinks(rng, *WINDOW_MIXED, 9, 3, 64, 16, dtype, torch.randn(9))
    finally:
        _core.set_num_threads(1)


@pytest.mark.parametrize("window", [0, 21])
@pytest.mark.parametrize("heads", [(8, 2), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sinks_batch_invariant_rows(window, heads, dtype):
    """batch_invariant with sinks: every token's bits are the same whether it
    is decoded alone, prefilled in one chunk, or in chunks within a batch."""
    hq, hkv = heads
    d, bs, n = 64, 16, 70
    rng = np.random.default_rng()
    num_blocks = 8
    k_cache = torch.randn(num_blocks, bs, hkv, d).to(dtype)
    v_cache = torch.randn(num_blocks, bs, hkv, d).to(dtype)
    table = torch.from_numpy(rng.permutation(num_blocks)[None, :].astype(np.int32))
    query = torch.randn(n, hq, d).to(dtype)
    sinks = torch.randn(hq) * 2

    def attend(rows, seq_len, tables=table):
        qsl = torch.tensor([0, len(rows)], dtype=torch.int32)
        return kernels.paged_attention(query[rows], k_cache, v_cache, tables,
                                       torch.tensor([seq_len], dtype=torch.int32), qsl, 0.125,
                                       batch_invariant=True, sliding_window=window, sinks=sinks)

    whole = attend(list(range(n)), n)
    run_with_sinks(rng, [n], [0], hq, hkv, d, bs, dtype, sinks, window, batch_invariant=True)
    for p in (0, 5, 20, 21, 22, 47, n - 1):
        assert torch.equal(attend([p], p + 1)[0], whole[p])
    assert torch.equal(attend(list(range(30, 55)), 55), whole[30:55])
    rows = [40, 41, 42, 12, 66]
    qsl = torch.tensor([0, 3, 4, 5], dtype=torch.int32)
    batched = kernels.paged_attention(query[rows], k_cache, v_cache, table.repeat(3, 1),
                                      torch.tensor([43, 13, 67], dtype=torch.int32), qsl, 0.125,
                                      batch_invariant=True, sliding_window=window, sinks=sinks)
    assert torch.equal(batched, whole[rows])


@pytest.mark.parametrize(
    "bad",
    [
        lambda hq: torch.zeros(hq, dtype=torch.float64),
        lambda hq: torch.zeros(hq, dtype=torch.bfloat16),
        lambda hq: torch.zeros(hq + 1),
        lambda hq: torch.zeros(1, hq),
        lambda hq: torch.zeros(2 * hq)[::2],  # non-contiguous
        lambda hq: torch.zeros(hq, device="meta"),
        lambda hq: [0.0] * hq,
    ],
)
def test_sinks_rejects_bad_argument(good_args, bad):
    hq = good_args["query"].shape[1]
    with pytest.raises(ValueError, match="sinks"):
        kernels.paged_attention(**good_args, sinks=bad(hq))
