"""Property tests (hypothesis state machines) for BlockPool and KVCacheManager:
no block is handed out twice, free + used always adds up to num_blocks, and
everything is free again at the end."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paternoster import _core

NUM_BLOCKS = 24


class BlockPoolMachine(RuleBasedStateMachine):
    """Model: a dict block id -> ref count of the blocks we hold."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = _core.BlockPool(NUM_BLOCKS)
        self.held: dict[int, int] = {}

    @rule(n=st.integers(0, NUM_BLOCKS + 3))
    def allocate(self, n: int) -> None:
        free = NUM_BLOCKS - len(self.held)
        if n > free:
            with pytest.raises(_core.OutOfBlocksError):
                self.pool.allocate(n)
            return
        ids = self.pool.allocate(n)
        assert len(ids) == n and len(set(ids)) == n
        for b in ids:
            assert b not in self.held, f"block {b} handed out twice"
            assert 0 <= b < NUM_BLOCKS
            self.held[b] = 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data: st.DataObject) -> None:
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=6, unique=True)
        )
        self.pool.free(ids)
        for b in ids:
            self.held[b] -= 1
            if self.held[b] == 0:
                del self.held[b]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        b = data.draw(st.sampled_from(sorted(self.held)))
        self.pool.incr_ref([b])
        self.held[b] += 1

    @rule(b=st.integers(-2, NUM_BLOCKS + 2))
    def double_free_is_rejected(self, b: int) -> None:
        if b in self.held:
            return
        with pytest.raises(ValueError):
            self.pool.free([b])

    @invariant()
    def counts_add_up(self) -> None:
        assert self.pool.num_free_blocks() + len(self.held) == NUM_BLOCKS
        assert self.pool.usage() == pytest.approx(len(self.held) / NUM_BLOCKS)
        for b, refs in self.held.items():
            assert self.pool.ref_count(b) == refs

    def teardown(self) -> None:
        """Release everything: the pool must be whole again."""
        for b, refs in list(self.held.items()):
            self.pool.free([b] * refs)
        assert self.pool.num_free_blocks() == NUM_BLOCKS
        assert all(self.pool.ref_count(b) == 0 for b in range(NUM_BLOCKS))


class KVCacheManagerMachine(RuleBasedStateMachine):
    """Model: request id -> number of tokens with slots."""

    BLOCK_SIZE = 4

    def __init__(self) -> None:
        super().__init__()
        self.kv = _core.KVCacheManager(NUM_BLOCKS, self.BLOCK_SIZE)
        self.tokens: dict[int, int] = {}

    def blocks(self, n_tokens: int) -> int:
        return -(-n_tokens // self.BLOCK_SIZE)

    @rule(req=st.integers(0, 7), n=st.integers(0, 40))
    def allocate_slots(self, req: int, n: int) -> None:
        have = self.blocks(self.tokens.get(req, 0)) if req in self.tokens else 0
        extra = max(0, self.blocks(n) - have)
        assert self.kv.num_required_blocks(req, n) == extra
        free_before = self.kv.num_free_blocks()
        table_before = list(self.kv.block_table(req)) if req in self.tokens else []
        ok = self.kv.allocate_slots(req, n)
        assert ok == (extra <= free_before)
        if ok:
            self.tokens[req] = max(self.tokens.get(req, 0), n)
            table = list(self.kv.block_table(req))
            assert table[: len(table_before)] == table_before  # tables only grow
            assert len(table) == max(len(table_before), self.blocks(n))
        else:  # all or nothing
            assert self.kv.num_free_blocks() == free_before
            assert self.kv.has_request(req) == (req in self.tokens)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(req)
        del self.tokens[req]
        assert not self.kv.has_request(req)

    @rule(req=st.integers(100, 105))
    def free_unknown_is_noop(self, req: int) -> None:
        before = self.kv.num_free_blocks()
        self.kv.free(req)
        assert self.kv.num_free_blocks() == before

    @invariant()
    def no_block_shared_and_counts_add_up(self) -> None:
        seen: set[int] = set()
        for req in self.tokens:
            table = list(self.kv.block_table(req))
            assert not seen.intersection(table), "block in two tables"
            seen.update(table)
        assert self.kv.num_free_blocks() + len(seen) == NUM_BLOCKS
        assert self.kv.num_requests() == len(self.tokens)

    def teardown(self) -> None:
        """Free every request: all blocks must come back."""
        for req in list(self.tokens):
            self.kv.free(req)
        assert self.kv.num_free_blocks() == NUM_BLOCKS
        assert self.kv.num_requests() == 0


TestBlockPool = BlockPoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKVCacheManager = KVCacheManagerMachine.TestCase
TestKVCacheManager.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_allocate_is_all_or_nothing():
    pool = _core.BlockPool(4)
    pool.allocate(3)
    with pytest.raises(_core.OutOfBlocksError):
        pool.allocate(2)
    assert pool.num_free_blocks() == 1
    assert not pool.can_allocate(2)


def test_free_error_leaves_ref_counts_unchanged():
    pool = _core.BlockPool(4)
    a = pool.allocate(2)
    with pytest.raises(ValueError, match="double free"):
        pool.free([a[0], a[0]])
    assert pool.ref_count(a[0]) == 1
    with pytest.raises(ValueError, match="out of range"):
        pool.free([a[1], 99])
    assert pool.ref_count(a[1]) == 1
    assert pool.num_free_blocks() == 2


def test_block_table_of_unknown_request_raises():
    kv = _core.KVCacheManager(4, 16)
    with pytest.raises(ValueError):
        kv.block_table(3)
    with pytest.raises(ValueError):
        kv.num_required_blocks(3, -1)
