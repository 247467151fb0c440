#include "paternoster/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace paternoster {
namespace {

TEST(KVCacheManager, RequiredBlocksRoundUp) {
  KVCacheManager kv(10, 4);
  EXPECT_EQ(kv.num_required_blocks(1, 0), 0);
  EXPECT_EQ(kv.num_required_blocks(1, 1), 1);
  EXPECT_EQ(kv.num_required_blocks(1, 4), 1);
  EXPECT_EQ(kv.num_required_blocks(1, 5), 2);
  EXPECT_THROW(kv.num_required_blocks(1, -1), std::invalid_argument);
}

TEST(KVCacheManager, AllocateSlotsGrowsTable) {
  KVCacheManager kv(10, 4);
  ASSERT_TRUE(kv.allocate_slots(1, 5));
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  EXPECT_EQ(kv.num_required_blocks(1, 8), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 8));
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  auto before = kv.block_table(1);
  ASSERT_TRUE(kv.allocate_slots(1, 9));
  auto after = kv.block_table(1);
  ASSERT_EQ(after.size(), 3u);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[1], before[1]);
  EXPECT_EQ(kv.num_free_blocks(), 7);
  EXPECT_NEAR(kv.usage(), 0.3, 1e-12);
}

TEST(KVCacheManager, AllocateSlotsIsAllOrNothing) {
  KVCacheManager kv(4, 2);
  ASSERT_TRUE(kv.allocate_slots(1, 5));  // 3 blocks
  EXPECT_FALSE(kv.can_allocate(2, 3));
  EXPECT_FALSE(kv.allocate_slots(2, 3));  // needs 2, 1 free
  EXPECT_FALSE(kv.has_request(2));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_FALSE(kv.allocate_slots(1, 9));  // needs 2 more
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_TRUE(kv.allocate_slots(2, 2));
}

TEST(KVCacheManager, NewRequestGetsTableEvenWithoutBlocks) {
  KVCacheManager kv(2, 2);
  EXPECT_TRUE(kv.allocate_slots(5, 0));
  EXPECT_TRUE(kv.has_request(5));
  EXPECT_TRUE(kv.block_table(5).empty());
  EXPECT_EQ(kv.num_requests(), 1);
}

TEST(KVCacheManager, FreeReturnsEverything) {
  KVCacheManager kv(16, 4);
  ASSERT_TRUE(kv.allocate_slots(1, 17));
  ASSERT_TRUE(kv.allocate_slots(2, 3));
  std::set<int32_t> seen;
  for (int64_t id : {1, 2}) {
    for (int32_t b : kv.block_table(id)) EXPECT_TRUE(seen.insert(b).second);
  }
  kv.free(1);
  kv.free(2);
  kv.free(3);  // unknown: no-op
  EXPECT_EQ(kv.num_free_blocks(), 16);
  EXPECT_EQ(kv.num_requests(), 0);
  EXPECT_THROW(kv.block_table(1), std::invalid_argument);
}


// ---- KV cache groups (full + sliding window)

std::vector<KVCacheGroupSpec> full_and_window(int64_t window) {
  return {KVCacheGroupSpec{0}, KVCacheGroupSpec{window}};
}
int64_t live(const std::vector<int32_t>& table) {
  int64_t n = 0;
  for (int32_t id : table) n += id != kNoBlock;
  return n;
}

TEST(KVCacheManagerGroups, RejectsBadGroups) {
  EXPECT_THROW(KVCacheManager(8, 4, false, {}), std::invalid_argument);
  EXPECT_THROW(KVCacheManager(8, 4, false, {KVCacheGroupSpec{-1}}), std::invalid_argument);
  KVCacheManager kv(8, 4, false, full_and_window(4));
  EXPECT_EQ(kv.num_groups(), 2);
  EXPECT_EQ(kv.group(1).sliding_window, 4);
  EXPECT_THROW(kv.group(2), std::invalid_argument);
  EXPECT_THROW(kv.find_block_table(0, 2), std::invalid_argument);
}

TEST(KVCacheManagerGroups, EveryGroupGetsItsOwnBlocks) {
  KVCacheManager kv(16, 4, false, full_and_window(8));
  // Nothing computed yet: both groups need the whole 10 tokens (3 blocks each).
  EXPECT_EQ(kv.num_required_blocks(1, 10), 6);
  ASSERT_TRUE(kv.allocate_slots(1, 10));
  const auto a = kv.block_table(1, 0), b = kv.block_table(1, 1);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  std::vector<int32_t> all(a);
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());  // disjoint
  EXPECT_EQ(kv.num_free_blocks(), 10);
  EXPECT_EQ(kv.num_request_blocks(1), 6);
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 16);
}

TEST(KVCacheManagerGroups, SlidingWindowReleasesBlocksOutOfReach) {
  // Window 6, blocks of 4. Decoding position p needs positions > p - 6.
  KVCacheManager kv(64, 4, false, {KVCacheGroupSpec{6}});
  ASSERT_TRUE(kv.allocate_slots(1, 8, 0));  // prompt of 8 in one step: blocks 0, 1
  EXPECT_EQ(live(kv.block_table(1)), 2);
  // Next token at position 8 sees 3..8: block 0 (0..3) still needed.
  ASSERT_TRUE(kv.allocate_slots(1, 9, 8));
  EXPECT_EQ(kv.block_table(1)[0] != kNoBlock, true);
  EXPECT_EQ(live(kv.block_table(1)), 3);
  // Position 9 sees 4..9: block 0 released.
  ASSERT_TRUE(kv.allocate_slots(1, 10, 9));
  auto t = kv.block_table(1);
  EXPECT_EQ(t[0], kNoBlock);
  EXPECT_EQ(live(t), 2);
  // A long decode holds at most ceil((W - 1) / bs) + 1 + 1 blocks.
  for (int64_t n = 10; n < 200; ++n) {
    ASSERT_TRUE(kv.allocate_slots(1, n + 1, n));
    EXPECT_LE(live(kv.block_table(1)), 3) << "at " << n;
  }
  EXPECT_EQ(kv.num_free_blocks(), 64 - live(kv.block_table(1)));
  kv.free(1);
  EXPECT_EQ(kv.num_free_blocks(), 64);
}

TEST(KVCacheManagerGroups, RequiredBlocksIsNetOfWhatTheWindowReleases) {
  KVCacheManager kv(4, 4, false, {KVCacheGroupSpec{4}});
  ASSERT_TRUE(kv.allocate_slots(1, 16, 0));  // 4 blocks: the pool is empty
  EXPECT_EQ(kv.num_free_blocks(), 0);
  // Computing tokens 16..19 from 16 needs positions 13..19: blocks 3, 4;
  // blocks 0..2 go back first, so the step fits an empty pool.
  EXPECT_EQ(kv.num_required_blocks(1, 20, 16), 0);
  EXPECT_TRUE(kv.can_allocate(1, 20, 16));
  // Without the computed count nothing is released: one more block needed.
  EXPECT_EQ(kv.num_required_blocks(1, 20), 1);
  EXPECT_FALSE(kv.can_allocate(1, 20));
  EXPECT_FALSE(kv.allocate_slots(1, 20));
  EXPECT_EQ(live(kv.block_table(1)), 4);  // all or nothing: unchanged
  ASSERT_TRUE(kv.allocate_slots(1, 20, 16));
  EXPECT_EQ(live(kv.block_table(1)), 2);
  EXPECT_EQ(kv.block_table(1).size(), 5u);
  EXPECT_EQ(kv.num_free_blocks(), 2);
}

TEST(KVCacheManagerGroups, FullGroupIgnoresComputedCount) {
  KVCacheManager kv(32, 4, false, full_and_window(4));
  ASSERT_TRUE(kv.allocate_slots(1, 40, 0));
  ASSERT_TRUE(kv.allocate_slots(1, 41, 40));
  EXPECT_EQ(live(kv.block_table(1, 0)), 11);
  EXPECT_EQ(live(kv.block_table(1, 1)), 2);  // positions 37..40: blocks 9, 10
  EXPECT_EQ(kv.num_request_blocks(1), 13);
  EXPECT_DOUBLE_EQ(kv.usage(), 13.0 / 32.0);
}

TEST(KVCacheManagerGroups, CachedPrefixHitsEveryGroupOrNone) {
  KVCacheManager kv(64, 4, true, full_and_window(4));
  std::vector<int64_t> tokens(20);
  for (int64_t i = 0; i < 20; ++i) tokens[i] = 100 + i;
  ASSERT_EQ(kv.get_computed_blocks(1, tokens), 0);
  ASSERT_TRUE(kv.allocate_slots(1, 20, 0));
  kv.cache_blocks(1, tokens);
  const auto full1 = kv.block_table(1, 0), win1 = kv.block_table(1, 1);
  kv.free(1);
  // Same prompt: 4 whole blocks hit (the last token stays to compute) in both
  // groups, each group's own blocks.
  EXPECT_EQ(kv.get_computed_blocks(2, tokens), 16);
  const auto full2 = kv.block_table(2, 0), win2 = kv.block_table(2, 1);
  EXPECT_EQ(std::vector<int32_t>(full1.begin(), full1.begin() + 4), full2);
  EXPECT_EQ(std::vector<int32_t>(win1.begin(), win1.begin() + 4), win2);
  // Allocating from the hit releases the window group's unreachable blocks.
  ASSERT_TRUE(kv.allocate_slots(2, 20, 16));
  EXPECT_EQ(live(kv.block_table(2, 1)), 2);  // positions 13..19: blocks 3, 4
  kv.free(2);
}

TEST(KVCacheManagerGroups, HitIsTheShortestGroupChain) {
  // 16 blocks of 4; a full group and a window-4 group.
  KVCacheManager kv(16, 4, true, full_and_window(4));
  std::vector<int64_t> tokens(17);
  for (int64_t i = 0; i < 17; ++i) tokens[i] = 7 * i;
  ASSERT_TRUE(kv.allocate_slots(1, 16, 0));  // 4 + 4 blocks
  kv.cache_blocks(1, tokens.data(), 16);
  const auto full1 = kv.block_table(1, 0);
  // Decoding position 16 releases the window group's cached blocks 0..2
  // (tail first, so block 2 is the least recently used) and takes 2 fresh.
  ASSERT_TRUE(kv.allocate_slots(1, 17, 16));
  EXPECT_EQ(kv.num_free_blocks(), 9);
  // Another request takes the 6 never-used blocks and evicts 2 cached ones:
  // the window group's blocks 2 and 1.
  ASSERT_TRUE(kv.allocate_slots(9, 16, 0));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  // The full group still holds a 4-block chain, the window group 1 block:
  // the request hits 1 block in both.
  EXPECT_EQ(kv.get_computed_blocks(2, tokens), 4);
  ASSERT_EQ(kv.block_table(2, 0).size(), 1u);
  ASSERT_EQ(kv.block_table(2, 1).size(), 1u);
  EXPECT_EQ(kv.block_table(2, 0)[0], full1[0]);
}

TEST(KVCacheManagerGroups, GroupsNeverShareCachedBlocks) {
  // All hashes collide: a group must not take another group's block even
  // with the same tokens, parent and salt.
  KVCacheManager kv(64, 4, true, full_and_window(4));
  kv.set_hash_mask_for_testing(0);
  std::vector<int64_t> tokens(9, 5);
  ASSERT_TRUE(kv.allocate_slots(1, 9, 0));
  kv.cache_blocks(1, tokens);
  kv.free(1);
  // Group 1 could cache nothing (its hash was taken by group 0's block 0),
  // and group 0's block is no hit for it: no prefix hits at all.
  EXPECT_EQ(kv.get_computed_blocks(2, tokens), 0);
  EXPECT_TRUE(kv.block_table(2, 1).empty());
}

// ---- recurrent-state groups (linear-attention layers)

std::vector<KVCacheGroupSpec> full_and_recurrent() {
  KVCacheGroupSpec state;
  state.recurrent = true;
  return {KVCacheGroupSpec{0}, state};
}

TEST(KVCacheManagerRecurrent, RejectsBadConfigurations) {
  KVCacheGroupSpec windowed;
  windowed.recurrent = true;
  windowed.sliding_window = 8;
  EXPECT_THROW(KVCacheManager(8, 4, false, {KVCacheGroupSpec{0}, windowed}, 4),
               std::invalid_argument);
  EXPECT_THROW(KVCacheManager(8, 4, false, full_and_recurrent(), 0), std::invalid_argument);
  EXPECT_THROW(KVCacheManager(8, 4, true, full_and_recurrent(), 4), std::invalid_argument);
  EXPECT_THROW(KVCacheManager(8, 4, false, {KVCacheGroupSpec{0}}, -1), std::invalid_argument);
}

TEST(KVCacheManagerRecurrent, OneSlotPerRequestHoweverLong) {
  KVCacheManager kv(16, 4, false, full_and_recurrent(), 2);
  EXPECT_EQ(kv.num_required_state_slots(1), 1);
  // Blocks count only the attention group: 10 tokens = 3 blocks.
  EXPECT_EQ(kv.num_required_blocks(1, 10), 3);
  ASSERT_TRUE(kv.allocate_slots(1, 10));
  EXPECT_EQ(kv.num_free_blocks(), 13);
  EXPECT_EQ(kv.num_free_state_slots(), 1);
  EXPECT_EQ(kv.num_required_state_slots(1), 0);
  const auto slot = kv.block_table(1, 1);
  ASSERT_EQ(slot.size(), 1u);
  EXPECT_GE(slot[0], 0);
  EXPECT_LT(slot[0], 2);
  // Growing keeps the slot.
  for (int64_t n = 11; n < 40; ++n) ASSERT_TRUE(kv.allocate_slots(1, n, n - 1));
  EXPECT_EQ(kv.block_table(1, 1), slot);
  EXPECT_EQ(kv.num_request_blocks(1), 10);  // 40 tokens... minus the last: 39 -> 10 blocks
  EXPECT_DOUBLE_EQ(kv.state_usage(), 0.5);
}

TEST(KVCacheManagerRecurrent, AdmissionWaitsForAFreeSlot) {
  KVCacheManager kv(64, 4, false, full_and_recurrent(), 2);
  ASSERT_TRUE(kv.allocate_slots(1, 4));
  ASSERT_TRUE(kv.allocate_slots(2, 4));
  EXPECT_NE(kv.block_table(1, 1), kv.block_table(2, 1));  // distinct slots
  // Blocks are plentiful, slots are not: all or nothing.
  EXPECT_FALSE(kv.can_allocate(3, 4));
  const int64_t free_blocks = kv.num_free_blocks();
  EXPECT_FALSE(kv.allocate_slots(3, 4));
  EXPECT_FALSE(kv.has_request(3));
  EXPECT_EQ(kv.num_free_blocks(), free_blocks);
  // Preempting (freeing) one returns its slot and its blocks.
  const auto slot1 = kv.block_table(1, 1);
  kv.free(1);
  EXPECT_EQ(kv.num_free_state_slots(), 1);
  ASSERT_TRUE(kv.allocate_slots(3, 4));
  EXPECT_EQ(kv.block_table(3, 1), slot1);
  kv.free(2);
  kv.free(3);
  EXPECT_EQ(kv.num_free_state_slots(), 2);
  EXPECT_EQ(kv.num_free_blocks(), 64);
}

}  // namespace
}  // namespace paternoster
