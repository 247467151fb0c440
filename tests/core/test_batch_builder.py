"""BatchBuilder.build() against a straightforward Python computation from the
block tables."""

from __future__ import annotations

import numpy as np
import pytest

from paternoster import _core


def expected_batch(tokens, tables, block_size, req_ids, computed, scheduled):
    """The arrays build() must return, computed token by token in Python."""
    input_ids, positions, slots, qsl = [], [], [], [0]
    seq_lens = [c + s for c, s in zip(computed, scheduled, strict=True)]
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    block_tables = np.zeros((len(req_ids), max_blocks), np.int32)
    for b, rid in enumerate(req_ids):
        for pos in range(computed[b], seq_lens[b]):
            input_ids.append(tokens[rid][pos])
            positions.append(pos)
            slots.append(tables[rid][pos // block_size] * block_size + pos % block_size)
        qsl.append(qsl[-1] + scheduled[b])
        n = -(-seq_lens[b] // block_size)
        block_tables[b, :n] = tables[rid][:n]
    return {
        "input_ids": np.array(input_ids, np.int64),
        "positions": np.array(positions, np.int64),
        "slot_mapping": np.array(slots, np.int64),
        "block_tables": block_tables,
        "seq_lens": np.array(seq_lens, np.int32),
        "query_start_loc": np.array(qsl, np.int32),
        "logits_indices": np.array(qsl[1:], np.int64) - 1,
    }


def check_batch(got, want):
    assert set(got) == set(want)
    for key, arr in want.items():
        assert got[key].dtype == arr.dtype, key
        np.testing.assert_array_equal(got[key], arr, err_msg=key)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_random_mixed_batches(block_size):
    rng = np.random.default_rng()
    kv = _core.KVCacheManager(4096, block_size)
    builder = _core.BatchBuilder(kv)
    tokens: dict[int, list[int]] = {}
    for rid in rng.choice(10**9, size=12, replace=False).tolist():
        prompt = rng.integers(0, 50_000, int(rng.integers(1, 80))).tolist()
        tokens[rid] = prompt
        builder.add_request(rid, prompt)
    for _ in range(5):
        req_ids = rng.permutation(list(tokens))[: int(rng.integers(1, 13))].tolist()
        computed, scheduled = [], []
        for rid in req_ids:
            n = len(tokens[rid])
            c = int(rng.integers(0, n))
            computed.append(c)
            scheduled.append(int(rng.integers(1, n - c + 1)))
            assert kv.allocate_slots(rid, c + scheduled[-1] + int(rng.integers(0, 20)))
        tables = {rid: kv.block_table(rid).tolist() for rid in req_ids}
        got = builder.build(
            np.array(req_ids, np.int64), np.array(computed, np.int32), np.array(scheduled, np.int32)
        )
        check_batch(got, expected_batch(tokens, tables, block_size, req_ids, computed, scheduled))
        # Decode step: one new token for every request in the batch.
        new = rng.integers(0, 50_000, len(req_ids))
        builder.append_tokens(np.array(req_ids, np.int64), new.astype(np.int32))
        for rid, tok in zip(req_ids, new.tolist(), strict=True):
            tokens[rid].append(tok)
            assert builder.num_tokens(rid) == len(tokens[rid])


def test_decode_step_of_many_requests():
    kv = _core.KVCacheManager(4096, 16)
    builder = _core.BatchBuilder(kv)
    ids = np.arange(256, dtype=np.int64)
    for rid in ids.tolist():
        builder.add_request(rid, np.full(100 + rid, rid, np.int64))
        assert kv.allocate_slots(rid, 101 + rid)
    builder.append_tokens(ids, ids + 7)
    lens = np.array([101 + r for r in ids.tolist()])
    got = builder.build(ids, (lens - 1).astype(np.int32), np.ones(256, np.int32))
    tokens = {r: [r] * (100 + r) + [r + 7] for r in ids.tolist()}
    tables = {r: kv.block_table(r).tolist() for r in ids.tolist()}
    want = expected_batch(tokens, tables, 16, ids.tolist(), (lens - 1).tolist(), [1] * 256)
    check_batch(got, want)


def test_accepts_lists_and_other_int_dtypes():
    kv = _core.KVCacheManager(8, 4)
    builder = _core.BatchBuilder(kv)
    builder.add_request(5, [1, 2, 3])
    assert kv.allocate_slots(5, 3)
    got = builder.build([5], [0], [3])
    np.testing.assert_array_equal(got["input_ids"], [1, 2, 3])
    builder.append_tokens(np.array([5], np.int32), np.array([9], np.int64))
    np.testing.assert_array_equal(builder.token_ids(5), [1, 2, 3, 9])


@pytest.mark.parametrize(
    ("req_ids", "computed", "scheduled", "match"),
    [
        ([9], [0], [1], "unknown request"),
        ([1], [0], [6], "tokens"),
        ([1], [0], [5], "KV slots"),
        ([1, 1], [0, 0], [1, 1], "twice"),
        ([1], [0], [0], "num_scheduled_tokens"),
        ([1], [-1], [2], "num_computed_tokens"),
        ([1], [0, 1], [1], "same length"),
    ],
)
def test_build_rejects_bad_schedules(req_ids, computed, scheduled, match):
    kv = _core.KVCacheManager(8, 4)
    builder = _core.BatchBuilder(kv)
    builder.add_request(1, list(range(5)))
    assert kv.allocate_slots(1, 4)
    with pytest.raises(ValueError, match=match):
        builder.build(req_ids, computed, scheduled)


def test_request_lifecycle_errors():
    kv = _core.KVCacheManager(8, 4)
    builder = _core.BatchBuilder(kv)
    builder.add_request(1, [1])
    with pytest.raises(ValueError, match="already"):
        builder.add_request(1, [2])
    with pytest.raises(ValueError, match="unknown"):
        builder.append_tokens([1, 2], [3, 4])
    assert builder.num_tokens(1) == 1  # nothing appended
    with pytest.raises(ValueError, match="same length"):
        builder.append_tokens([1], [3, 4])
    builder.remove_request(1)
    builder.remove_request(1)  # no-op
    assert not builder.has_request(1)
    with pytest.raises(ValueError):
        builder.num_tokens(1)


def test_builder_keeps_manager_alive():
    builder = _core.BatchBuilder(_core.KVCacheManager(8, 4))
    builder.add_request(1, [1, 2])
    with pytest.raises(ValueError, match="KV"):
        builder.build([1], [0], [2])
