// Automatic prefix caching: BlockPool's hash map and LRU free list, and
// KVCacheManager's lookup (get_computed_blocks) and caching (cache_blocks).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "paternoster/block_pool.h"
#include "paternoster/kv_cache_manager.h"

namespace paternoster {
namespace {

std::vector<int64_t> iota_tokens(int64_t n, int64_t start = 0) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// ------------------------------------------------------------ BlockPool

TEST(BlockPoolCache, CachedBlockSurvivesFreeAndTouchRevivesIt) {
  BlockPool pool(4, /*enable_caching=*/true);
  auto a = pool.allocate(2);
  ASSERT_TRUE(pool.cache_block(a[0], 100));
  pool.free(a);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  ASSERT_EQ(pool.cached_block(100), a[0]);
  EXPECT_EQ(pool.block_hash(a[0]), BlockHash{100});
  const uint64_t gen = pool.generation(a[0]);
  pool.touch({a[0]});
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.block_hash(a[0]), BlockHash{100});
  EXPECT_EQ(pool.generation(a[0]), gen);  // a hit is not a new content
  pool.touch({a[0]});                     // a second sharer
  EXPECT_EQ(pool.ref_count(a[0]), 2);
}

TEST(BlockPoolCache, UncachedFreeBlocksAreReusedFirst) {
  BlockPool pool(4, true);
  auto a = pool.allocate(4);
  ASSERT_TRUE(pool.cache_block(a[0], 10));
  ASSERT_TRUE(pool.cache_block(a[1], 11));
  pool.free(a);
  // Uncached a[2], a[3] at the front (last freed first), cached at the back.
  EXPECT_EQ(pool.free_block_ids(), (std::vector<int32_t>{a[3], a[2], a[0], a[1]}));
  auto b = pool.allocate(2);
  EXPECT_EQ(b, (std::vector<int32_t>{a[3], a[2]}));
  EXPECT_EQ(pool.num_cached_blocks(), 2);
  EXPECT_EQ(pool.num_evictions(), 0);
}

TEST(BlockPoolCache, EvictsLeastRecentlyFreedCachedBlock) {
  BlockPool pool(3, true);
  auto a = pool.allocate(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.cache_block(a[i], 100 + i));
  pool.free({a[1]});
  pool.free({a[2]});
  pool.free({a[0]});
  pool.touch({a[1]});  // a hit moves a[1] out ...
  pool.free({a[1]});   // ... and back as the most recently used
  EXPECT_EQ(pool.free_block_ids(), (std::vector<int32_t>{a[2], a[0], a[1]}));
  const uint64_t gen = pool.generation(a[2]);
  EXPECT_EQ(pool.allocate(1)[0], a[2]);
  EXPECT_EQ(pool.generation(a[2]), gen + 1);
  EXPECT_FALSE(pool.cached_block(102).has_value());
  EXPECT_FALSE(pool.block_hash(a[2]).has_value());
  EXPECT_EQ(pool.allocate(1)[0], a[0]);
  EXPECT_FALSE(pool.cached_block(100).has_value());
  EXPECT_EQ(pool.cached_block(101), a[1]);
  EXPECT_EQ(pool.num_evictions(), 2);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
}

TEST(BlockPoolCache, CacheBlockChecks) {
  BlockPool pool(3, true);
  auto a = pool.allocate(2);
  EXPECT_TRUE(pool.cache_block(a[0], 7));
  EXPECT_FALSE(pool.cache_block(a[1], 7));  // hash already held by a[0]
  EXPECT_FALSE(pool.block_hash(a[1]).has_value());
  EXPECT_THROW(pool.cache_block(a[0], 8), std::invalid_argument);  // already cached
  EXPECT_THROW(pool.cache_block(2, 9), std::invalid_argument);     // free block
  EXPECT_THROW(pool.cache_block(5, 9), std::invalid_argument);     // out of range
  EXPECT_THROW(pool.touch({3}), std::invalid_argument);
  BlockPool off(2);
  auto b = off.allocate(1);
  EXPECT_THROW(off.cache_block(b[0], 1), std::logic_error);
  EXPECT_THROW(off.cached_block(1), std::logic_error);
  EXPECT_FALSE(off.block_hash(b[0]).has_value());
}

TEST(BlockPoolCache, ResetDropsEveryHash) {
  BlockPool pool(3, true);
  auto a = pool.allocate(3);
  ASSERT_TRUE(pool.cache_block(a[0], 1));
  ASSERT_TRUE(pool.cache_block(a[1], 2));
  pool.free({a[0]});
  EXPECT_EQ(pool.reset_cache(), 2);
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_FALSE(pool.cached_block(1).has_value());
  EXPECT_FALSE(pool.block_hash(a[1]).has_value());  // in use, uncached too
  pool.free({a[2]});
  // a[0] became an uncached free block (front); a[2] too, pushed in front of it.
  EXPECT_EQ(pool.free_block_ids(), (std::vector<int32_t>{a[2], a[0]}));
  EXPECT_EQ(pool.ref_count(a[1]), 1);
}

// ------------------------------------------------------------ KVCacheManager

// Runs a request through the manager: lookup, allocate, "compute" everything,
// cache. Returns the hit tokens.
int64_t run_request(KVCacheManager& kv, int64_t id, const std::vector<int64_t>& tokens,
                    std::string_view salt = {}) {
  const int64_t hit = kv.get_computed_blocks(id, tokens, salt);
  EXPECT_TRUE(kv.allocate_slots(id, static_cast<int64_t>(tokens.size())));
  kv.cache_blocks(id, tokens);
  return hit;
}

TEST(PrefixCache, ReuseAfterFree) {
  KVCacheManager kv(10, 4, true);
  auto t = iota_tokens(10);
  EXPECT_EQ(run_request(kv, 1, t), 0);
  auto first = kv.block_table(1);
  EXPECT_EQ(kv.num_cached_blocks(), 2);  // 2 full blocks; the partial third is not cached
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 10);
  auto t2 = t;
  t2.push_back(99);
  EXPECT_EQ(kv.get_computed_blocks(2, t2), 8);
  auto table = kv.block_table(2);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0], first[0]);
  EXPECT_EQ(table[1], first[1]);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  EXPECT_EQ(kv.prefix_cache_queries(), 21);
  EXPECT_EQ(kv.prefix_cache_hits(), 8);
  ASSERT_TRUE(kv.allocate_slots(2, 11));
  EXPECT_EQ(kv.block_table(2).size(), 3u);
}

TEST(PrefixCache, AlwaysLeavesTheLastTokenToCompute) {
  KVCacheManager kv(10, 4, true);
  auto t = iota_tokens(8);
  run_request(kv, 1, t);
  EXPECT_EQ(kv.num_cached_blocks(), 2);
  EXPECT_EQ(kv.get_computed_blocks(2, t), 4);  // not 8: the last token is recomputed
  kv.free(2);
  EXPECT_EQ(kv.get_computed_blocks(3, iota_tokens(1)), 0);
  kv.free(3);
  EXPECT_EQ(kv.get_computed_blocks(4, std::vector<int64_t>{}), 0);
  kv.free(4);
  EXPECT_EQ(kv.get_computed_blocks(5, iota_tokens(9)), 8);
}

TEST(PrefixCache, PartialBlockPrefixAndDivergence) {
  KVCacheManager kv(12, 4, true);
  run_request(kv, 1, iota_tokens(12));
  // Shares 6 tokens: one whole block.
  auto t = iota_tokens(6);
  for (int64_t x : {50, 51, 52, 53, 54}) t.push_back(x);
  EXPECT_EQ(kv.get_computed_blocks(2, t), 4);
  // A prefix of request 1's prompt.
  EXPECT_EQ(kv.get_computed_blocks(3, iota_tokens(9)), 8);
  // Differs in the first token: nothing.
  EXPECT_EQ(kv.get_computed_blocks(4, iota_tokens(12, 1)), 0);
}

TEST(PrefixCache, HitBlocksAreRefCountedAndNeverEvicted) {
  KVCacheManager kv(6, 4, true);
  auto t = iota_tokens(9);
  run_request(kv, 1, t);
  EXPECT_EQ(run_request(kv, 2, t), 8);
  auto t1 = kv.block_table(1), t2 = kv.block_table(2);
  EXPECT_EQ(t1[0], t2[0]);
  EXPECT_EQ(t1[1], t2[1]);
  EXPECT_NE(t1[2], t2[2]);
  EXPECT_EQ(kv.pool().ref_count(t1[0]), 2);
  kv.free(1);
  EXPECT_EQ(kv.pool().ref_count(t1[0]), 1);
  EXPECT_EQ(kv.num_free_blocks(), 3);
  // Take every free block: the shared ones are not among them.
  ASSERT_TRUE(kv.allocate_slots(3, 12));
  for (int32_t b : kv.block_table(3)) {
    EXPECT_NE(b, t2[0]);
    EXPECT_NE(b, t2[1]);
  }
  EXPECT_EQ(kv.pool().block_hash(t2[0]).has_value(), true);
  EXPECT_FALSE(kv.allocate_slots(4, 1));
}

TEST(PrefixCache, FreeReleasesTailFirst) {
  KVCacheManager kv(4, 2, true);
  run_request(kv, 1, iota_tokens(7));  // blocks b0 b1 b2 cached, b3 partial
  auto table = kv.block_table(1);
  kv.free(1);
  // Uncached b3 first to reuse; then the cached ones, tail first.
  EXPECT_EQ(kv.pool().free_block_ids(),
            (std::vector<int32_t>{table[3], table[2], table[1], table[0]}));
  // Evicting one block drops the tail, and the prefix still hits.
  ASSERT_TRUE(kv.allocate_slots(9, 4));
  kv.free(9);
  EXPECT_EQ(kv.get_computed_blocks(2, iota_tokens(7)), 4);
}

TEST(PrefixCache, PeekFindsWhatTheLookupTakesAndTakesNothing) {
  KVCacheManager kv(12, 4, true);
  run_request(kv, 1, iota_tokens(12), "s");
  kv.free(1);  // cached, free, evictable
  auto diverges = iota_tokens(6);
  for (int64_t x : {50, 51, 52, 53, 54}) diverges.push_back(x);
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
      {iota_tokens(12), "s"},   {iota_tokens(9), "s"}, {iota_tokens(8), "s"},
      {diverges, "s"},          {iota_tokens(12), ""}, {iota_tokens(12, 1), "s"},
      {iota_tokens(1), "s"},    {{}, "s"}};
  int64_t id = 10;
  for (const auto& [tokens, salt] : cases) {
    const int64_t free = kv.num_free_blocks(), queries = kv.prefix_cache_queries();
    const int64_t peeked =
        kv.num_cached_prefix_tokens(tokens.data(), static_cast<int64_t>(tokens.size()), salt);
    EXPECT_EQ(kv.num_free_blocks(), free);  // nothing touched or counted
    EXPECT_EQ(kv.prefix_cache_queries(), queries);
    EXPECT_EQ(kv.num_request_blocks(id), 0);
    EXPECT_EQ(peeked, kv.get_computed_blocks(id, tokens, salt)) << tokens.size() << salt;
    kv.free(id++);
  }
  EXPECT_THROW(kv.num_cached_prefix_tokens(nullptr, -1), std::invalid_argument);
  KVCacheManager off(4, 4, false);
  auto t = iota_tokens(9);
  EXPECT_EQ(off.num_cached_prefix_tokens(t.data(), 9), 0);
}

TEST(PrefixCache, SaltSeparatesCaches) {
  KVCacheManager kv(10, 4, true);
  auto t = iota_tokens(9);
  run_request(kv, 1, t, "tenant-a");
  EXPECT_EQ(kv.get_computed_blocks(2, t, "tenant-b"), 0);
  EXPECT_EQ(kv.get_computed_blocks(3, t), 0);
  EXPECT_EQ(kv.get_computed_blocks(4, t, "tenant-a"), 8);
}

TEST(PrefixCache, CollisionIsAMiss) {
  KVCacheManager kv(10, 4, true);
  kv.set_hash_mask_for_testing(0);  // every block hashes to 0
  auto a = iota_tokens(9);
  run_request(kv, 1, a);
  // Block 1 collided with block 0's hash: only block 0 is cached.
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  auto b = iota_tokens(9, 100);
  EXPECT_EQ(run_request(kv, 2, b), 0);  // same hash, other tokens: a miss
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  EXPECT_EQ(kv.get_computed_blocks(3, a), 4);
  // Same tokens under a salt: the salt is compared too.
  EXPECT_EQ(kv.get_computed_blocks(4, a, "s"), 0);
}

TEST(PrefixCache, DuplicateStaysUncachedAndEvictedParentStopsCaching) {
  KVCacheManager kv(8, 2, true);
  auto t = iota_tokens(5);
  // Both requests are admitted before either computed anything: no hits.
  EXPECT_EQ(kv.get_computed_blocks(1, t), 0);
  EXPECT_EQ(kv.get_computed_blocks(2, t), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 5));
  ASSERT_TRUE(kv.allocate_slots(2, 5));
  kv.cache_blocks(1, t.data(), 2);  // request 1 caches its block 0 only
  kv.cache_blocks(2, t.data(), 2);  // same content: request 2's copy stays uncached
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  EXPECT_FALSE(kv.pool().block_hash(kv.block_table(2)[0]).has_value());
  kv.free(1);
  // Evict request 1's block 0 (2 free uncached blocks, then the cached one).
  ASSERT_TRUE(kv.allocate_slots(3, 10));
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  // Request 2's block 1 would chain to an evicted parent: not cached.
  kv.cache_blocks(2, t.data(), 4);
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  kv.free(3);
  EXPECT_EQ(kv.get_computed_blocks(4, t), 0);
}

// A hash that ignores the parent: every block starting with the same token
// collides, whatever precedes it.
BlockHash first_token_hash(BlockHash, const int64_t* tokens, int64_t) {
  return static_cast<BlockHash>(tokens[0]);
}

TEST(PrefixCache, ChildOfAnEvictedAndReusedParentIsAMiss) {
  KVCacheManager kv(6, 2, true);
  kv.set_hash_fn_for_testing(&first_token_hash);
  const std::vector<int64_t> t{1, 2, 3, 4, 9};
  EXPECT_EQ(kv.get_computed_blocks(1, t), 0);
  EXPECT_EQ(kv.get_computed_blocks(2, t), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 5));
  ASSERT_TRUE(kv.allocate_slots(2, 5));
  const int32_t d = kv.block_table(1)[0];
  kv.cache_blocks(1, t.data(), 2);  // D = [1 2]
  kv.cache_blocks(2, t.data(), 4);  // request 2's [3 4] is cached with parent D
  const int32_t c = kv.block_table(2)[1];
  ASSERT_EQ(kv.pool().block_hash(c), BlockHash{3});
  kv.free(1);
  ASSERT_TRUE(kv.allocate_slots(9, 4));  // takes request 1's two uncached blocks
  // Request 3 gets D's block id for new content [5 6], cached as a first block.
  const std::vector<int64_t> z{5, 6};
  EXPECT_EQ(kv.get_computed_blocks(3, z), 0);
  ASSERT_TRUE(kv.allocate_slots(3, 2));
  ASSERT_EQ(kv.block_table(3)[0], d);
  kv.cache_blocks(3, z);
  ASSERT_EQ(kv.pool().cached_block(5), d);
  // [5 6] hits D; [3 4] finds C by hash, with the right tokens and parent id,
  // but C followed D's previous content: a miss.
  EXPECT_EQ(kv.get_computed_blocks(4, std::vector<int64_t>{5, 6, 3, 4, 0}), 2);
}

TEST(PrefixCache, TokenIdsBeyondInt32AreNotCached) {
  KVCacheManager kv(8, 2, true);
  const std::vector<int64_t> t{1, 2, int64_t{1} << 32, 3, 4, 5, 6};
  run_request(kv, 1, t);
  EXPECT_EQ(kv.num_cached_blocks(), 1);  // [1 2]; the block holding 2^32 and after: not
  EXPECT_EQ(kv.get_computed_blocks(2, t), 2);
  // A token equal to 2^32 + 1 must not match a stored 1 (no truncation).
  EXPECT_EQ(kv.get_computed_blocks(3, std::vector<int64_t>{(int64_t{1} << 32) + 1, 2, 0}), 0);
}

TEST(PrefixCache, PreemptedRequestReHitsItsBlocks) {
  KVCacheManager kv(6, 4, true);
  auto t = iota_tokens(14);
  run_request(kv, 1, t);
  kv.free(1);  // preempted
  EXPECT_EQ(kv.get_computed_blocks(1, t), 12);
}

TEST(PrefixCache, ResetForgetsEverything) {
  KVCacheManager kv(10, 4, true);
  auto t = iota_tokens(9);
  run_request(kv, 1, t);
  EXPECT_EQ(kv.reset_prefix_cache(), 2);
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  kv.cache_blocks(1, t);  // the running request caches nothing more
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  EXPECT_EQ(kv.get_computed_blocks(2, t), 0);
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.num_free_blocks(), 10);
  // Caching works again for new requests.
  run_request(kv, 3, t);
  EXPECT_EQ(kv.num_cached_blocks(), 2);
}

TEST(PrefixCache, CacheBlocksIsIncremental) {
  KVCacheManager kv(10, 4, true);
  auto t = iota_tokens(12);
  EXPECT_EQ(kv.get_computed_blocks(1, t), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 12));
  kv.cache_blocks(1, t.data(), 3);
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  kv.cache_blocks(1, t.data(), 5);
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  kv.cache_blocks(1, t.data(), 5);
  EXPECT_EQ(kv.num_cached_blocks(), 1);
  EXPECT_TRUE(kv.has_blocks_to_cache(1, 12));
  kv.cache_blocks(1, t.data(), 12);
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  EXPECT_FALSE(kv.has_blocks_to_cache(1, 12));
  EXPECT_FALSE(kv.has_blocks_to_cache(1, 15));
  EXPECT_TRUE(kv.has_blocks_to_cache(1, 16));
  EXPECT_TRUE(kv.has_blocks_to_cache(2, 4));  // unknown to the cache yet
  EXPECT_FALSE(kv.has_blocks_to_cache(2, 3));
  KVCacheManager off(4, 4);
  EXPECT_FALSE(off.has_blocks_to_cache(1, 100));
}

TEST(PrefixCache, ErrorsAndCachingOff) {
  KVCacheManager kv(4, 4, true);
  auto t = iota_tokens(8);
  EXPECT_THROW(kv.cache_blocks(1, t), std::invalid_argument);  // unknown
  ASSERT_TRUE(kv.allocate_slots(1, 4));
  EXPECT_THROW(kv.cache_blocks(1, t), std::invalid_argument);  // 2 full, 1 block
  EXPECT_THROW(kv.cache_blocks(1, t.data(), -1), std::invalid_argument);
  EXPECT_THROW(kv.get_computed_blocks(1, t), std::invalid_argument);  // has a table
  EXPECT_THROW(kv.get_computed_blocks(2, t.data(), -1), std::invalid_argument);

  KVCacheManager off(4, 4);
  EXPECT_FALSE(off.enable_caching());
  EXPECT_EQ(off.get_computed_blocks(1, t), 0);
  EXPECT_FALSE(off.has_request(1));
  ASSERT_TRUE(off.allocate_slots(1, 8));
  off.cache_blocks(1, t);
  EXPECT_EQ(off.num_cached_blocks(), 0);
  EXPECT_EQ(off.reset_prefix_cache(), 0);
  auto table = off.block_table(1);
  off.free(1);
  // Old order: freed in table order, to the back.
  EXPECT_EQ(off.pool().free_block_ids(),
            (std::vector<int32_t>{2, 3, table[0], table[1]}));
  EXPECT_EQ(off.prefix_cache_queries(), 0);
}

}  // namespace
}  // namespace paternoster
