#include "paternoster/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace paternoster {
namespace {

TEST(BlockPool, StartsAllFree) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_blocks(), 8);
  EXPECT_EQ(pool.num_free_blocks(), 8);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(pool.ref_count(i), 0);
}

TEST(BlockPool, AllocateHandsOutDistinctBlocks) {
  BlockPool pool(10);
  auto a = pool.allocate(4);
  auto b = pool.allocate(6);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  for (int32_t id : all) EXPECT_EQ(pool.ref_count(id), 1);
}

TEST(BlockPool, AllocateIsAllOrNothing) {
  BlockPool pool(5);
  auto a = pool.allocate(3);
  EXPECT_THROW(pool.allocate(3), OutOfBlocks);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  EXPECT_FALSE(pool.can_allocate(3));
  EXPECT_TRUE(pool.can_allocate(2));
  EXPECT_EQ(pool.allocate(2).size(), 2u);
  EXPECT_THROW(pool.allocate(-1), std::invalid_argument);
  EXPECT_TRUE(pool.allocate(0).empty());
}

TEST(BlockPool, FreeReturnsBlocksInLeastRecentlyFreedOrder) {
  BlockPool pool(4);
  auto a = pool.allocate(4);
  pool.free({a[2]});
  pool.free({a[0]});
  auto b = pool.allocate(2);
  EXPECT_EQ(b[0], a[2]);
  EXPECT_EQ(b[1], a[0]);
}

TEST(BlockPool, RefCountsKeepSharedBlocksAlive) {
  BlockPool pool(3);
  auto a = pool.allocate(2);
  pool.incr_ref({a[0]});
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.free(a);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.ref_count(a[1]), 0);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.free({a[0]});
  EXPECT_EQ(pool.num_free_blocks(), 3);
}

TEST(BlockPool, DoubleFreeThrowsAndChangesNothing) {
  BlockPool pool(4);
  auto a = pool.allocate(3);
  pool.free({a[1]});
  EXPECT_THROW(pool.free({a[0], a[1]}), std::invalid_argument);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);
  // The same block twice in one call with a single reference is a double free.
  EXPECT_THROW(pool.free({a[2], a[2]}), std::invalid_argument);
  EXPECT_EQ(pool.ref_count(a[2]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 2);
}

TEST(BlockPool, OutOfRangeThrows) {
  BlockPool pool(4);
  EXPECT_THROW(pool.free({4}), std::invalid_argument);
  EXPECT_THROW(pool.free({-1}), std::invalid_argument);
  EXPECT_THROW(pool.ref_count(7), std::invalid_argument);
  EXPECT_THROW(pool.incr_ref({0}), std::invalid_argument);  // free block
  EXPECT_THROW(BlockPool(-1), std::invalid_argument);
}

TEST(BlockPool, FailedFreeRestoresFreeListOrder) {
  BlockPool pool(5);
  auto a = pool.allocate(5);
  pool.free({a[3]});
  // a[1] and a[4] would go to the free list before the error on a[3].
  EXPECT_THROW(pool.free({a[1], a[4], a[3]}), std::invalid_argument);
  EXPECT_EQ(pool.num_free_blocks(), 1);
  EXPECT_EQ(pool.allocate(1)[0], a[3]);
}

}  // namespace
}  // namespace paternoster
