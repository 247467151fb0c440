// Host-side checks of the CUDA attention API that need no GPU: argument
// validation (std::invalid_argument before any launch), empty batches, and the
// split-K plan and workspace sizes.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

#include "paternoster/cuda_attention.h"

namespace pc = paternoster::cuda;

namespace {

// A well-formed decode batch on fake (never dereferenced) 16-byte aligned pointers.
pc::PagedAttentionArgs decode_args() {
  alignas(16) static char fake[64];
  pc::PagedAttentionArgs a;
  a.out = fake;
  a.query = fake;
  a.key_cache = fake;
  a.value_cache = fake;
  a.block_tables = reinterpret_cast<const int32_t*>(fake);
  a.seq_lens = reinterpret_cast<const int32_t*>(fake);
  a.query_start_loc = reinterpret_cast<const int32_t*>(fake);
  a.num_tokens = 4;
  a.num_seqs = 4;
  a.num_heads = 32;
  a.num_kv_heads = 8;
  a.head_size = 128;
  a.num_blocks = 100;
  a.block_size = 16;
  a.max_blocks_per_seq = 8;
  a.max_query_len = 1;
  a.scale = 0.088f;
  return a;
}

}  // namespace

TEST(CudaSplitPlan, BigBatchesDoNotSplit) {
  EXPECT_EQ(pc::decode_num_splits(512, 32, 8, 2048, 132), 1);
}

TEST(CudaSplitPlan, ShortContextsDoNotSplit) {
  EXPECT_EQ(pc::decode_num_splits(1, 32, 8, pc::kMinSplitTokens, 132), 1);
}

TEST(CudaSplitPlan, SmallBatchesOfLongContextsSplit) {
  const int64_t z = pc::decode_num_splits(1, 32, 8, 32768, 132);
  EXPECT_GT(z, 1);
  EXPECT_LE(z, pc::kMaxSplits);
  // Never more splits than kMinSplitTokens-token chunks of the context.
  EXPECT_EQ(pc::decode_num_splits(1, 32, 8, 300, 132), 3);
}

TEST(CudaSplitPlan, WorkspaceCoversEveryBatchSize) {
  const int64_t bytes = pc::decode_workspace_bytes(256, 32, 8, 128, 4096, 132);
  EXPECT_GT(bytes, 0);
  for (int64_t b = 1; b <= 256; ++b) {
    const int64_t z = pc::decode_num_splits(b, 32, 8, 4096, 132);
    if (z > 1) EXPECT_GE(bytes, b * 32 * z * (128 + 2) * 4) << "batch " << b;
  }
  EXPECT_EQ(pc::decode_workspace_bytes(256, 32, 8, 128, 64, 132), 0);
}

TEST(CudaSplitPlan, RejectsNonPositiveSizes) {
  EXPECT_THROW(pc::decode_num_splits(0, 32, 8, 2048, 132), std::invalid_argument);
  EXPECT_THROW(pc::decode_num_splits(1, 30, 8, 2048, 132), std::invalid_argument);
  EXPECT_THROW(pc::decode_workspace_bytes(1, 32, 8, 0, 2048, 132), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsUnsupportedHeadSize) {
  auto a = decode_args();
  a.head_size = 96;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsBlockSizesThatAreNotPowersOfTwo) {
  auto a = decode_args();
  a.block_size = 12;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
  a.block_size = 4;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsHeadsNotAMultipleOfKvHeads) {
  auto a = decode_args();
  a.num_heads = 30;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsMisalignedPointers) {
  auto a = decode_args();
  a.query = static_cast<const char*>(a.query) + 2;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsShortStrides) {
  auto a = decode_args();
  a.query_stride = 32 * 128 - 8;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsNullPointers) {
  auto a = decode_args();
  a.seq_lens = nullptr;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsTooManySequences) {
  auto a = decode_args();
  a.num_seqs = 70000;
  a.num_tokens = 70000;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsNegativeSlidingWindow) {
  auto a = decode_args();
  a.sliding_window = 512;
  EXPECT_NO_THROW(pc::check_paged_attention_args(a));
  a.sliding_window = -1;
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
  EXPECT_THROW(pc::check_paged_attention_args(a), std::invalid_argument);
}

TEST(CudaPagedAttention, RejectsMisalignedSinks) {
  auto a = decode_args();
  alignas(16) static float sinks[33] = {};
  a.sinks = sinks;
  EXPECT_NO_THROW(pc::check_paged_attention_args(a));
  a.sinks = reinterpret_cast<const float*>(reinterpret_cast<const char*>(sinks) + 2);
  EXPECT_THROW(pc::paged_attention(a, nullptr), std::invalid_argument);
  EXPECT_THROW(pc::check_paged_attention_args(a), std::invalid_argument);
}

TEST(CudaPagedAttention, CheckMatchesTheLauncher) {
  auto a = decode_args();
  EXPECT_NO_THROW(pc::check_paged_attention_args(a));
  a.head_size = 80;
  EXPECT_THROW(pc::check_paged_attention_args(a), std::invalid_argument);
}

TEST(CudaPagedAttention, TakesHeadSizes64To256) {
  for (int64_t d : {64, 128, 256}) {
    auto a = decode_args();
    a.head_size = d;
    EXPECT_NO_THROW(pc::check_paged_attention_args(a)) << "head size " << d;
  }
  auto a = decode_args();
  a.head_size = 512;
  EXPECT_THROW(pc::check_paged_attention_args(a), std::invalid_argument);
  // Gemma 3 1B's shapes (4 query heads, 1 kv head): a long context splits,
  // each split holding D + 2 floats per (sequence, head).
  const int64_t z = pc::decode_num_splits(8, 4, 1, 32768, 132);
  ASSERT_GT(z, 1);
  EXPECT_GE(pc::decode_workspace_bytes(8, 4, 1, 256, 32768, 132), 8 * 4 * z * (256 + 2) * 4);
}

TEST(CudaPagedAttention, EmptyBatchLaunchesNothing) {
  auto a = decode_args();
  a.num_seqs = 0;
  EXPECT_EQ(pc::paged_attention(a, nullptr), cudaSuccess);
  a = decode_args();
  a.num_tokens = 0;
  a.max_query_len = 0;
  EXPECT_EQ(pc::paged_attention(a, nullptr), cudaSuccess);
}

TEST(CudaReshapeAndCache, RejectsBadSizes) {
  pc::CacheWriteArgs a;
  a.num_tokens = 1;
  a.num_kv_heads = 8;
  a.head_size = 7;
  EXPECT_THROW(pc::reshape_and_cache(a, nullptr), std::invalid_argument);
  a.head_size = 128;
  a.key_stride = 100;
  EXPECT_THROW(pc::reshape_and_cache(a, nullptr), std::invalid_argument);
  a.key_stride = 0;
  EXPECT_THROW(pc::reshape_and_cache(a, nullptr), std::invalid_argument);  // null pointers
  a.num_tokens = 0;
  EXPECT_EQ(pc::reshape_and_cache(a, nullptr), cudaSuccess);
}
