"""Automatic prefix caching through ``paternoster._core`` (the C++ logic has its
GoogleTest suite in core/tests/prefix_cache_test.cc).

A hypothesis state machine mixes admission (lookup + allocate), chunked
computation (cache the newly full blocks), decoding, preemption-style frees,
eviction pressure and resets, and checks after every step that a cache hit
only ever returns blocks whose (simulated) KV is exactly the requested prefix,
that no block is both free and in use, that ref counts match the tables, and
that the hash map and the free list agree with each block's state.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from paternoster import _core

NUM_BLOCKS = 16
BLOCK_SIZE = 2
ALL_ONES = (1 << 64) - 1


def test_lookup_reuses_blocks_after_free() -> None:
    kv = _core.KVCacheManager(8, 4, enable_caching=True)
    tokens = list(range(10))
    assert kv.get_computed_blocks(1, tokens) == 0
    assert kv.allocate_slots(1, 10)
    kv.cache_blocks(1, tokens)
    first = kv.block_table(1)
    kv.free(1)
    assert kv.get_computed_blocks(2, [*tokens, 5]) == 8
    assert list(kv.block_table(2)) == list(first[:2])
    assert (kv.prefix_cache_queries(), kv.prefix_cache_hits()) == (21, 8)


def test_salt_and_caching_off() -> None:
    kv = _core.KVCacheManager(8, 4, enable_caching=True)
    tokens = np.arange(9, dtype=np.int64)
    kv.get_computed_blocks(1, tokens, cache_salt="a")
    kv.allocate_slots(1, 9)
    kv.cache_blocks(1, tokens, num_tokens=8)
    assert kv.get_computed_blocks(2, tokens, cache_salt="b") == 0
    assert kv.get_computed_blocks(3, tokens, cache_salt="a") == 8
    off = _core.KVCacheManager(8, 4)
    assert not off.enable_caching()
    assert off.get_computed_blocks(1, tokens) == 0
    assert not off.has_request(1)


def test_errors() -> None:
    kv = _core.KVCacheManager(8, 4, enable_caching=True)
    with pytest.raises(ValueError, match="unknown request"):
        kv.cache_blocks(1, [1, 2, 3, 4])
    kv.allocate_slots(1, 4)
    with pytest.raises(ValueError, match="exceeds"):
        kv.cache_blocks(1, [1, 2, 3, 4], num_tokens=5)
    with pytest.raises(ValueError, match="already has KV blocks"):
        kv.get_computed_blocks(1, [1, 2])
    with pytest.raises(RuntimeError):
        _core.BlockPool(2).cache_block(0, 1)


def test_cache_computed_blocks_reads_tokens_from_batch_builder() -> None:
    kv = _core.KVCacheManager(8, 2, enable_caching=True)
    bb = _core.BatchBuilder(kv)
    bb.add_request(1, [1, 2, 3, 4, 5])
    kv.allocate_slots(1, 5)
    kv.cache_computed_blocks(bb, [1], [4])
    assert kv.num_cached_blocks() == 2
    with pytest.raises(ValueError, match="exceeds"):
        kv.cache_computed_blocks(bb, [1], [6])
    with pytest.raises(ValueError, match="same length"):
        kv.cache_computed_blocks(bb, [1], [4, 4])


class PrefixCacheMachine(RuleBasedStateMachine):
    """Model: each live request's tokens, salt and computed count; for every
    block, the (salt, token prefix) whose KV it holds (None: not written)."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = _core.KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_caching=True)
        self.bb = _core.BatchBuilder(self.kv)
        self.pool = self.kv.pool
        self.live: dict[int, dict] = {}
        self.content: dict[int, tuple | None] = {}
        self.next_id = 0

    @initialize(mask=st.sampled_from([ALL_ONES, 0x3, 0]))
    def set_mask(self, mask: int) -> None:
        # Small masks force hash collisions: hits must stay exact anyway.
        self.kv._set_hash_mask_for_testing(mask)

    # ---------------------------------------------------------------- rules

    @rule(
        tokens=st.lists(st.integers(0, 1), min_size=1, max_size=12),
        salt=st.sampled_from([None, "a"]),
    )
    def admit(self, tokens: list[int], salt: str | None) -> None:
        rid = self.next_id
        self.next_id += 1
        hit = self.kv.get_computed_blocks(rid, tokens, cache_salt=salt)
        assert hit % BLOCK_SIZE == 0 and 0 <= hit <= len(tokens) - 1
        table = list(self.kv.block_table(rid))
        assert len(table) == hit // BLOCK_SIZE
        for i, b in enumerate(table):
            expected = (salt, tuple(tokens[: (i + 1) * BLOCK_SIZE]))
            assert self.content.get(b) == expected, "a hit returned the wrong KV"
        if not self.kv.allocate_slots(rid, len(tokens)):
            self.kv.free(rid)  # not admitted: give the hit blocks back
            return
        for b in list(self.kv.block_table(rid))[len(table) :]:
            self.content[b] = None  # fresh block: its old KV is gone
        self.bb.add_request(rid, tokens)
        self.live[rid] = {"tokens": list(tokens), "salt": salt, "computed": hit}

    @precondition(lambda self: any(r["computed"] < len(r["tokens"]) for r in self.live.values()))
    @rule(data=st.data())
    def compute(self, data: st.DataObject) -> None:
        rid = data.draw(
            st.sampled_from(
                sorted(k for k, r in self.live.items() if r["computed"] < len(r["tokens"]))
            )
        )
        r = self.live[rid]
        n = data.draw(st.integers(1, len(r["tokens"]) - r["computed"]))
        start, end = r["computed"], r["computed"] + n
        table = list(self.kv.block_table(rid))
        # "Run the model": write KV for positions start .. end-1; a block's
        # content is complete once its last slot is written.
        for i in range(start // BLOCK_SIZE, end // BLOCK_SIZE):
            self.content[table[i]] = (r["salt"], tuple(r["tokens"][: (i + 1) * BLOCK_SIZE]))
        r["computed"] = end
        self.kv.cache_computed_blocks(self.bb, [rid], [end])

    @precondition(lambda self: any(r["computed"] == len(r["tokens"]) for r in self.live.values()))
    @rule(data=st.data(), token=st.integers(0, 1))
    def decode(self, data: st.DataObject, token: int) -> None:
        rid = data.draw(
            st.sampled_from(
                sorted(k for k, r in self.live.items() if r["computed"] == len(r["tokens"]))
            )
        )
        r = self.live[rid]
        before = len(self.kv.block_table(rid))
        if not self.kv.allocate_slots(rid, len(r["tokens"]) + 1):
            self._drop(rid)  # preempted
            return
        for b in list(self.kv.block_table(rid))[before:]:
            self.content[b] = None
        r["tokens"].append(token)
        self.bb.append_tokens([rid], [token])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        self._drop(data.draw(st.sampled_from(sorted(self.live))))

    @rule()
    def reset(self) -> None:
        self.kv.reset_prefix_cache()
        assert self.kv.num_cached_blocks() == 0

    def _drop(self, rid: int) -> None:
        self.kv.free(rid)
        self.bb.remove_request(rid)
        del self.live[rid]

    # ----------------------------------------------------------- invariants

    @invariant()
    def ref_counts_match_tables(self) -> None:
        refs = [0] * NUM_BLOCKS
        for rid in self.live:
            for b in self.kv.block_table(rid):
                refs[b] += 1
        for b in range(NUM_BLOCKS):
            assert self.pool.ref_count(b) == refs[b]
        free = self.pool.free_block_ids()
        assert len(free) == len(set(free)) == self.kv.num_free_blocks()
        assert set(free) == {b for b in range(NUM_BLOCKS) if refs[b] == 0}, "free and in use"
        assert self.kv.num_free_blocks() + sum(r > 0 for r in refs) == NUM_BLOCKS

    @invariant()
    def hash_map_agrees_with_blocks(self) -> None:
        cached = 0
        for b in range(NUM_BLOCKS):
            h = self.pool.block_hash(b)
            if h is None:
                continue
            cached += 1
            assert self.pool.cached_block(h) == b
            assert self.content.get(b) is not None, "cached block holds no computed KV"
        assert cached == self.kv.num_cached_blocks()

    @invariant()
    def uncached_free_blocks_come_first(self) -> None:
        kinds = [self.pool.block_hash(b) is not None for b in self.pool.free_block_ids()]
        assert kinds == sorted(kinds)

    def teardown(self) -> None:
        for rid in list(self.live):
            self._drop(rid)
        assert self.kv.num_free_blocks() == NUM_BLOCKS


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_prefix_cache_machine = PrefixCacheMachine.TestCase
