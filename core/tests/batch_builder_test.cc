#include "paternoster/batch_builder.h"

#include <gtest/gtest.h>

namespace paternoster {
namespace {

std::vector<int64_t> iota(int64_t n, int64_t start) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(BatchBuilder, MixedBatchArrays) {
  KVCacheManager kv(32, 4);
  BatchBuilder bb(kv);
  // Request 10: decode of token 9 (9 computed); request 20: prompt of 6;
  // request 30: second prefill chunk, tokens 4..6.
  bb.add_request(10, iota(10, 100));
  bb.add_request(20, iota(6, 200));
  bb.add_request(30, iota(8, 300));
  ASSERT_TRUE(kv.allocate_slots(10, 10));
  ASSERT_TRUE(kv.allocate_slots(20, 6));
  ASSERT_TRUE(kv.allocate_slots(30, 7));
  Batch b = bb.build({10, 20, 30}, {9, 0, 4}, {1, 6, 3});

  EXPECT_EQ(b.shape.num_seqs, 3);
  EXPECT_EQ(b.shape.num_tokens, 10);
  EXPECT_EQ(b.shape.max_blocks, 3);
  EXPECT_EQ(b.input_ids, (std::vector<int64_t>{109, 200, 201, 202, 203, 204, 205, 304, 305, 306}));
  EXPECT_EQ(b.positions, (std::vector<int64_t>{9, 0, 1, 2, 3, 4, 5, 4, 5, 6}));
  EXPECT_EQ(b.seq_lens, (std::vector<int32_t>{10, 6, 7}));
  EXPECT_EQ(b.query_start_loc, (std::vector<int32_t>{0, 1, 7, 10}));
  EXPECT_EQ(b.logits_indices, (std::vector<int64_t>{0, 6, 9}));

  const auto t10 = kv.block_table(10), t20 = kv.block_table(20), t30 = kv.block_table(30);
  EXPECT_EQ(b.block_tables, (std::vector<int32_t>{t10[0], t10[1], t10[2], t20[0], t20[1], 0,
                                                   t30[0], t30[1], 0}));
  EXPECT_EQ(b.slot_mapping[0], t10[2] * 4 + 1);
  for (int64_t p = 0; p < 6; ++p) EXPECT_EQ(b.slot_mapping[1 + p], t20[p / 4] * 4 + p % 4);
  for (int64_t p = 4; p < 7; ++p) EXPECT_EQ(b.slot_mapping[7 + p - 4], t30[p / 4] * 4 + p % 4);
}

TEST(BatchBuilder, AppendTokensIsVectorised) {
  KVCacheManager kv(8, 4);
  BatchBuilder bb(kv);
  bb.add_request(1, iota(3, 0));
  bb.add_request(2, iota(1, 0));
  const int64_t ids[] = {2, 1};
  const int32_t toks[] = {7, 8};
  bb.append_tokens(ids, toks, 2);
  EXPECT_EQ(bb.num_tokens(1), 4);
  EXPECT_EQ(bb.num_tokens(2), 2);
  EXPECT_EQ((*bb.find_tokens(1))[3], 8);
  const int64_t bad[] = {1, 99};
  EXPECT_THROW(bb.append_tokens(bad, toks, 2), std::invalid_argument);
  EXPECT_EQ(bb.num_tokens(1), 4);  // nothing appended
}

TEST(BatchBuilder, RejectsBadSchedules) {
  KVCacheManager kv(8, 4);
  BatchBuilder bb(kv);
  bb.add_request(1, iota(5, 0));
  ASSERT_TRUE(kv.allocate_slots(1, 4));
  EXPECT_THROW(bb.build({2}, {0}, {1}), std::invalid_argument);   // unknown
  EXPECT_THROW(bb.build({1}, {0}, {6}), std::invalid_argument);   // too few tokens
  EXPECT_THROW(bb.build({1}, {0}, {5}), std::invalid_argument);   // lacks KV slots
  EXPECT_THROW(bb.build({1, 1}, {0, 0}, {1, 1}), std::invalid_argument);  // listed twice
  EXPECT_THROW(bb.build({1}, {0}, {0}), std::invalid_argument);   // nothing scheduled
  EXPECT_THROW(bb.add_request(1, iota(1, 0)), std::invalid_argument);
  EXPECT_NO_THROW(bb.build({1}, {0}, {4}));
  bb.remove_request(1);
  EXPECT_FALSE(bb.has_request(1));
}

TEST(BatchBuilder, EmptyBatch) {
  KVCacheManager kv(8, 4);
  BatchBuilder bb(kv);
  Batch b = bb.build({}, {}, {});
  EXPECT_EQ(b.shape.num_tokens, 0);
  EXPECT_EQ(b.query_start_loc, (std::vector<int32_t>{0}));
}

TEST(BatchBuilder, OneSlotMappingAndTablePerKVCacheGroup) {
  // Group 0 full attention, group 1 a window of 4 tokens; blocks of 4.
  KVCacheManager kv(32, 4, false, {KVCacheGroupSpec{0}, KVCacheGroupSpec{4}});
  BatchBuilder bb(kv);
  bb.add_request(10, iota(13, 100));  // decode of position 12
  bb.add_request(20, iota(3, 200));   // prompt of 3
  ASSERT_TRUE(kv.allocate_slots(10, 12, 0));
  ASSERT_TRUE(kv.allocate_slots(10, 13, 12));  // releases group 1's blocks 0, 1
  ASSERT_TRUE(kv.allocate_slots(20, 3, 0));
  Batch b = bb.build({10, 20}, {12, 0}, {1, 3});

  EXPECT_EQ(b.shape.num_groups, 2);
  EXPECT_EQ(b.shape.max_blocks, 4);
  const auto f10 = kv.block_table(10, 0), w10 = kv.block_table(10, 1);
  const auto f20 = kv.block_table(20, 0), w20 = kv.block_table(20, 1);
  ASSERT_EQ(w10[0], kNoBlock);
  ASSERT_EQ(w10[1], kNoBlock);
  EXPECT_EQ(b.block_tables, (std::vector<int32_t>{f10[0], f10[1], f10[2], f10[3], f20[0], 0, 0, 0}));
  EXPECT_EQ(b.group_block_tables,
            (std::vector<int32_t>{kNoBlock, kNoBlock, w10[2], w10[3], w20[0], 0, 0, 0}));
  EXPECT_EQ(b.slot_mapping, (std::vector<int64_t>{f10[3] * 4, f20[0] * 4, f20[0] * 4 + 1,
                                                  f20[0] * 4 + 2}));
  EXPECT_EQ(b.group_slot_mapping, (std::vector<int64_t>{w10[3] * 4, w20[0] * 4, w20[0] * 4 + 1,
                                                        w20[0] * 4 + 2}));
  // A schedule reaching back into released blocks is refused.
  EXPECT_THROW(bb.build({10}, {4}, {9}), std::invalid_argument);
}

TEST(BatchBuilder, RecurrentGroupCarriesTheStateSlot) {
  KVCacheGroupSpec state;
  state.recurrent = true;
  KVCacheManager kv(32, 4, false, {KVCacheGroupSpec{0}, state}, 4);
  BatchBuilder bb(kv);
  bb.add_request(10, iota(9, 100));  // decode of position 8
  bb.add_request(20, iota(3, 200));  // prompt of 3
  ASSERT_TRUE(kv.allocate_slots(10, 9, 8));
  ASSERT_TRUE(kv.allocate_slots(20, 3, 0));
  Batch b = bb.build({10, 20}, {8, 0}, {1, 3});
  const int32_t s10 = kv.block_table(10, 1)[0], s20 = kv.block_table(20, 1)[0];
  EXPECT_EQ(b.shape.max_blocks, 3);
  EXPECT_EQ(b.group_block_tables, (std::vector<int32_t>{s10, 0, 0, s20, 0, 0}));
  EXPECT_EQ(b.group_slot_mapping, (std::vector<int64_t>{s10, s20, s20, s20}));
  // A request with no allocation has no state slot either.
  bb.add_request(30, iota(2, 300));
  EXPECT_THROW(bb.build({30}, {0}, {2}), std::invalid_argument);
}

}  // namespace
}  // namespace paternoster
