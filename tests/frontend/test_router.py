"""The data-parallel router: prefix-cache affinity first, then least loaded."""

from __future__ import annotations

import pytest

from paternoster import _core
from paternoster.frontend.router import (
    EngineLoad,
    NoEngineAvailableError,
    Router,
    prefix_block_hashes,
)

BS = 4
IDLE = EngineLoad(available=True)


def _loads(*requests: int, dead: tuple[int, ...] = ()) -> list[EngineLoad]:
    return [EngineLoad(available=i not in dead, num_requests=n) for i, n in enumerate(requests)]


# ---------------------------------------------------------------- hashing

_MASK = (1 << 64) - 1


def _fnv(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & _MASK
    return h


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _reference_hashes(tokens: list[int], block_size: int, salt: str = "") -> list[int]:
    """The chain of core/include/paternoster/block_hash.h, written from its comment."""
    parent = _mix(_fnv(salt.encode(), _fnv(b"paternoster-prefix-v1\0")))
    out = []
    for i in range(len(tokens) // block_size):
        h = _fnv(parent.to_bytes(8, "little"))
        for t in tokens[i * block_size : (i + 1) * block_size]:
            h = _fnv((t & _MASK).to_bytes(8, "little"), h)
        parent = _mix(h)
        out.append(parent)
    return out


def test_hashes_follow_the_documented_chain():
    tokens = list(range(100, 114))  # 3 full blocks + 2
    assert prefix_block_hashes(tokens, BS) == _reference_hashes(tokens, BS)
    assert prefix_block_hashes(tokens, BS, "s1") == _reference_hashes(tokens, BS, "s1")


def test_hashes_equal_the_kv_cache_managers_own():
    kv = _core.KVCacheManager(32, BS, enable_caching=True)
    tokens = [7, 3, 9, 1, 4, 4, 2, 8, 6, 5, 0, 11, 12]
    for rid, salt in ((1, None), (2, "tenant-a")):
        kv.get_computed_blocks(rid, tokens, salt)
        kv.allocate_slots(rid, len(tokens))
        kv.cache_blocks(rid, tokens)
        table = kv.block_table(rid)
        cached = [kv.pool.block_hash(int(b)) for b in table[: len(tokens) // BS]]
        assert prefix_block_hashes(tokens, BS, salt) == cached


def test_hashes_stop_at_max_blocks_and_skip_a_partial_block():
    tokens = list(range(11))
    assert len(prefix_block_hashes(tokens, BS)) == 2
    assert prefix_block_hashes(tokens, BS, max_blocks=1) == prefix_block_hashes(tokens, BS)[:1]
    assert prefix_block_hashes(tokens[:3], BS) == []


def test_hashes_reject_bad_arguments():
    with pytest.raises(ValueError, match="block_size"):
        prefix_block_hashes([1, 2], 0)
    with pytest.raises(ValueError, match="max_blocks"):
        prefix_block_hashes([1, 2], 1, max_blocks=-1)


# ---------------------------------------------------------------- routing


def test_same_long_prefix_goes_to_the_same_engine():
    r = Router(3)
    base = list(range(40))
    first = r.route(prefix_block_hashes(base + [1, 2, 3, 4], BS), _loads(0, 0, 0))
    # The first engine is now busier, yet the shared prefix wins.
    for tail in ([5, 6, 7, 8], [9, 9, 9, 9], [1, 1]):
        loads = _loads(*(2 if i == first else 0 for i in range(3)))
        assert r.route(prefix_block_hashes(base + tail, BS), loads) == first
    assert r.num_affinity_routed == 3


def test_different_salts_do_not_share_a_prefix():
    r = Router(2)
    tokens = list(range(32))
    a = r.route(prefix_block_hashes(tokens, BS, "alice"), _loads(0, 0))
    loads = _loads(*(1 if i == a else 0 for i in range(2)))
    b = r.route(prefix_block_hashes(tokens, BS, "bob"), loads)
    assert b != a  # no affinity across salts: the least loaded engine
    assert r.route(prefix_block_hashes(tokens, BS, "alice"), _loads(1, 1)) == a


def test_no_prefix_goes_to_the_least_loaded_engine():
    r = Router(3)
    assert r.route([], _loads(5, 2, 7)) == 1
    assert r.route([], _loads(0, 0, 0)) == 2  # ties rotate, starting past the last choice


def test_kv_usage_breaks_a_tie_in_requests():
    r = Router(2)
    loads = [EngineLoad(True, 3, 0.9), EngineLoad(True, 3, 0.2)]
    assert r.route([], loads) == 1


def test_idle_engines_take_turns():
    r = Router(3)
    assert [r.route([], _loads(0, 0, 0)) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_overloaded_affinity_engine_is_passed_over():
    r = Router(2, balance_abs_threshold=4, balance_rel_threshold=1.5)
    hashes = prefix_block_hashes(list(range(16)), BS)
    r.record(hashes, 0)
    assert r.route(hashes, _loads(4, 0)) == 0  # 4 more: within the absolute slack
    assert r.route(hashes, _loads(20, 15)) == 0  # 5 more, but under 1.5x
    assert r.route(hashes, _loads(5, 0)) == 1  # 5 more and over 1.5x: least loaded
    assert r.cached_engine(hashes) == (1, len(hashes))  # the prefix now lives there


def test_dead_engine_is_never_chosen():
    r = Router(2)
    hashes = prefix_block_hashes(list(range(16)), BS)
    r.record(hashes, 0)
    assert r.route(hashes, _loads(0, 9, dead=(0,))) == 1
    assert r.route([], _loads(0, 9, dead=(0,))) == 1
    with pytest.raises(NoEngineAvailableError):
        r.route(hashes, _loads(0, 0, dead=(0, 1)))


def test_longest_cached_prefix_wins():
    r = Router(2)
    short, long = list(range(8)), list(range(24))
    r.record(prefix_block_hashes(short, BS), 0)
    r.record(prefix_block_hashes(long, BS), 1)
    assert r.cached_engine(prefix_block_hashes(long + [99] * 4, BS)) == (1, 6)
    assert r.cached_engine(prefix_block_hashes(short + [77] * 4, BS)) == (1, 2)
    assert r.cached_engine(prefix_block_hashes([5] * 8, BS)) is None


def test_map_is_bounded_lru_and_forget_drops_an_engine():
    r = Router(2, max_entries=4)
    r.record([1, 2, 3], 0)
    r.record([4, 5], 1)
    assert len(r) == 4 and r.cached_engine([1]) is None  # the oldest went first
    r.forget(1)
    assert len(r) == 2 and r.cached_engine([2, 3]) == (0, 2)
    r.forget()
    assert len(r) == 0


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_engines"):
        Router(0)
    with pytest.raises(ValueError, match="balance_rel_threshold"):
        Router(2, balance_rel_threshold=0.5)
    with pytest.raises(ValueError, match="expected 2 engine loads"):
        Router(2).route([], [IDLE])
    with pytest.raises(ValueError, match="engine must be in"):
        Router(2).record([1], 2)
    with pytest.raises(ValueError, match="policy must be one of affinity, round_robin"):
        Router(2, policy="random")


def test_round_robin_rotates_over_available_engines_whatever_the_prefix_and_load():
    r = Router(3, policy="round_robin")
    hashes = prefix_block_hashes(list(range(16)), BS)
    # the same prefix, and engine 0 idle while the others are busy: still rotation
    chosen = [r.route(hashes, _loads(0, 50, 50)) for _ in range(6)]
    assert chosen == [0, 1, 2, 0, 1, 2]
    # a dead engine is skipped and the rotation goes on after the one chosen
    assert [r.route(hashes, _loads(0, 0, 0, dead=(1,))) for _ in range(4)] == [0, 2, 0, 2]
    with pytest.raises(NoEngineAvailableError):
        r.route(hashes, _loads(0, 0, 0, dead=(0, 1, 2)))
    assert r.num_affinity_routed == 0 and len(r) == 0  # nothing remembered
    assert (r.num_round_robin_routed, r.num_load_routed) == (10, 0)  # what /stats shows
