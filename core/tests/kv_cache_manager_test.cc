#include "paternoster/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace paternoster
