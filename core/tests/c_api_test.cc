// The C API (c_api.h): error codes and messages, no exception across the
// boundary, and batches equal to what the C++ BatchBuilder builds.
#include "paternoster/c_api.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "paternoster/batch_builder.h"
#include "paternoster/kv_cache_manager.h"

namespace {

// Owning wrappers so a failed assertion does not leak handles.
struct Deleter {
  void operator()(pn_block_pool_t* p) const { pn_block_pool_destroy(p); }
  void operator()(pn_kv_cache_manager_t* p) const { pn_kv_cache_manager_destroy(p); }
  void operator()(pn_batch_builder_t* p) const { pn_batch_builder_destroy(p); }
  void operator()(pn_batch_t* p) const { pn_batch_destroy(p); }
};
using Pool = std::unique_ptr<pn_block_pool_t, Deleter>;
using Manager = std::unique_ptr<pn_kv_cache_manager_t, Deleter>;
using Builder = std::unique_ptr<pn_batch_builder_t, Deleter>;
using BatchHandle = std::unique_ptr<pn_batch_t, Deleter>;

Manager make_manager(int64_t num_blocks, int64_t block_size, int caching = 0) {
  pn_kv_cache_manager_t* m = nullptr;
  EXPECT_EQ(pn_kv_cache_manager_create(num_blocks, block_size, caching, &m), PN_OK);
  return Manager(m);
}
Builder make_builder(pn_kv_cache_manager_t* m) {
  pn_batch_builder_t* b = nullptr;
  EXPECT_EQ(pn_batch_builder_create(m, &b), PN_OK);
  return Builder(b);
}
BatchHandle make_batch() {
  pn_batch_t* b = nullptr;
  EXPECT_EQ(pn_batch_create(&b), PN_OK);
  return BatchHandle(b);
}
Pool make_pool(int64_t num_blocks) {
  pn_block_pool_t* p = nullptr;
  EXPECT_EQ(pn_block_pool_create(num_blocks, &p), PN_OK);
  return Pool(p);
}

std::vector<int64_t> iota(int64_t n, int64_t start) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

int64_t num_free(const pn_kv_cache_manager_t* m) {
  int64_t n = -1;
  EXPECT_EQ(pn_kv_cache_manager_num_free_blocks(m, &n), PN_OK);
  return n;
}

template <typename T>
std::vector<T> to_vector(pn_status_t (*get)(const pn_batch_t*, const T**, int64_t*),
                         const pn_batch_t* batch) {
  const T* data = nullptr;
  int64_t len = -1;
  EXPECT_EQ(get(batch, &data, &len), PN_OK);
  return data == nullptr ? std::vector<T>() : std::vector<T>(data, data + len);
}

bool message_has(const char* text) {
  return std::strstr(pn_last_error_message(), text) != nullptr;
}

TEST(CApi, VersionAndStatusNames) {
  EXPECT_EQ(pn_version(), static_cast<uint32_t>(PN_VERSION));
  EXPECT_STREQ(pn_status_string(PN_OK), "PN_OK");
  EXPECT_STREQ(pn_status_string(PN_ERR_OUT_OF_BLOCKS), "PN_ERR_OUT_OF_BLOCKS");
  EXPECT_STREQ(pn_status_string(static_cast<pn_status_t>(99)), "PN_ERR_UNKNOWN");
}

TEST(CApi, FunctionsAreNoexcept) {
  static_assert(noexcept(pn_kv_cache_manager_allocate_slots(nullptr, 0, 0)));
  static_assert(noexcept(pn_batch_builder_build(nullptr, nullptr, nullptr, nullptr, 0, nullptr)));
  static_assert(noexcept(pn_block_pool_free(nullptr, nullptr, 0)));
  static_assert(noexcept(pn_last_error_message()));
}

TEST(CApi, NullHandlesAreInvalidArguments) {
  int64_t n = 0;
  int flag = 0;
  EXPECT_EQ(pn_kv_cache_manager_allocate_slots(nullptr, 1, 4), PN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("pn_kv_cache_manager_allocate_slots: manager is NULL"));
  EXPECT_EQ(pn_kv_cache_manager_free(nullptr, 1), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_num_free_blocks(nullptr, &n), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_has_request(nullptr, 1, &flag), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_batch_builder_create(nullptr, nullptr), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_batch_builder_add_request(nullptr, 1, nullptr, 0), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_batch_builder_build(nullptr, nullptr, nullptr, nullptr, 0, nullptr),
            PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_batch_shape(nullptr, &n, nullptr, nullptr), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_block_pool_num_free_blocks(nullptr, &n), PN_ERR_INVALID_ARGUMENT);
  // Destroying NULL is a no-op.
  EXPECT_EQ(pn_kv_cache_manager_destroy(nullptr), PN_OK);
  EXPECT_EQ(pn_batch_builder_destroy(nullptr), PN_OK);
  EXPECT_EQ(pn_batch_destroy(nullptr), PN_OK);
  EXPECT_EQ(pn_block_pool_destroy(nullptr), PN_OK);
}

TEST(CApi, BadSizesAndPointersAreInvalidArguments) {
  pn_kv_cache_manager_t* raw = nullptr;
  EXPECT_EQ(pn_kv_cache_manager_create(-1, 16, 0, &raw), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_create(8, 0, 0, &raw), PN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("block_size"));
  EXPECT_EQ(pn_kv_cache_manager_create(8, 4, 0, nullptr), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(raw, nullptr);  // no output on error

  Manager m = make_manager(8, 4);
  Builder b = make_builder(m.get());
  int64_t n = 0;
  EXPECT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, -1), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_num_required_blocks(m.get(), 1, -5, &n), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_num_required_blocks(m.get(), 1, 5, nullptr),
            PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_batch_builder_add_request(b.get(), 1, nullptr, 3), PN_ERR_INVALID_ARGUMENT);
  const auto prompt = iota(3, 0);
  EXPECT_EQ(pn_batch_builder_add_request(b.get(), 1, prompt.data(), -3), PN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(message_has("negative count"));
  EXPECT_EQ(pn_kv_cache_manager_block_table(m.get(), 1, nullptr, -1, &n),
            PN_ERR_INVALID_ARGUMENT);
  int64_t num_requests = -1;
  ASSERT_EQ(pn_batch_builder_num_requests(b.get(), &num_requests), PN_OK);
  EXPECT_EQ(num_requests, 0);

  pn_block_pool_t* pool = nullptr;
  EXPECT_EQ(pn_block_pool_create(-4, &pool), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_block_pool_create(int64_t{1} << 40, &pool), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pool, nullptr);
}

TEST(CApi, UnknownRequestIsNotFound) {
  Manager m = make_manager(8, 4);
  Builder b = make_builder(m.get());
  BatchHandle batch = make_batch();
  int64_t n = 0;
  int32_t table[8];
  EXPECT_EQ(pn_kv_cache_manager_free(m.get(), 42), PN_ERR_NOT_FOUND);
  EXPECT_TRUE(message_has("42"));
  EXPECT_EQ(pn_kv_cache_manager_block_table(m.get(), 42, table, 8, &n), PN_ERR_NOT_FOUND);
  EXPECT_EQ(pn_batch_builder_remove_request(b.get(), 42), PN_ERR_NOT_FOUND);
  EXPECT_EQ(pn_batch_builder_num_tokens(b.get(), 42, &n), PN_ERR_NOT_FOUND);
  const auto tokens = iota(4, 0);
  EXPECT_EQ(pn_kv_cache_manager_cache_blocks(m.get(), 42, tokens.data(), 4), PN_ERR_NOT_FOUND);

  // append_tokens checks every id before appending anything.
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 1, tokens.data(), 4), PN_OK);
  const int64_t ids[] = {1, 42}, next[] = {7, 8};
  EXPECT_EQ(pn_batch_builder_append_tokens(b.get(), ids, next, 2), PN_ERR_NOT_FOUND);
  ASSERT_EQ(pn_batch_builder_num_tokens(b.get(), 1, &n), PN_OK);
  EXPECT_EQ(n, 4);

  // build: unknown to the builder, or known but without KV blocks.
  const int32_t computed[] = {0}, scheduled[] = {4};
  const int64_t unknown[] = {42};
  EXPECT_EQ(pn_batch_builder_build(b.get(), unknown, computed, scheduled, 1, batch.get()),
            PN_ERR_NOT_FOUND);
  EXPECT_EQ(pn_batch_builder_build(b.get(), ids, computed, scheduled, 1, batch.get()),
            PN_ERR_NOT_FOUND);
  EXPECT_TRUE(message_has("no KV blocks"));
}

TEST(CApi, OutOfBlocksChangesNothing) {
  Manager m = make_manager(4, 4);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 12), PN_OK);  // 3 blocks
  int can = -1;
  ASSERT_EQ(pn_kv_cache_manager_can_allocate(m.get(), 2, 8, &can), PN_OK);
  EXPECT_EQ(can, 0);
  EXPECT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 2, 8), PN_ERR_OUT_OF_BLOCKS);
  EXPECT_TRUE(message_has("free"));
  EXPECT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 20), PN_ERR_OUT_OF_BLOCKS);
  EXPECT_EQ(num_free(m.get()), 1);
  int has = -1;
  ASSERT_EQ(pn_kv_cache_manager_has_request(m.get(), 2, &has), PN_OK);
  EXPECT_EQ(has, 0);  // no table created by the failed call
  int64_t len = -1;
  ASSERT_EQ(pn_kv_cache_manager_block_table(m.get(), 1, nullptr, 0, &len),
            PN_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(len, 3);

  Pool pool = make_pool(3);
  int32_t ids[4] = {-1, -1, -1, -1};
  EXPECT_EQ(pn_block_pool_allocate(pool.get(), 4, ids), PN_ERR_OUT_OF_BLOCKS);
  EXPECT_EQ(ids[0], -1);
  int64_t pool_free = -1;
  ASSERT_EQ(pn_block_pool_num_free_blocks(pool.get(), &pool_free), PN_OK);
  EXPECT_EQ(pool_free, 3);
}

TEST(CApi, DuplicateRequestIsAlreadyExists) {
  Manager m = make_manager(8, 4, /*caching=*/1);
  Builder b = make_builder(m.get());
  const auto tokens = iota(5, 0);
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 1, tokens.data(), 5), PN_OK);
  EXPECT_EQ(pn_batch_builder_add_request(b.get(), 1, tokens.data(), 5), PN_ERR_ALREADY_EXISTS);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 5), PN_OK);
  int64_t computed = -1;
  EXPECT_EQ(pn_kv_cache_manager_get_computed_blocks(m.get(), 1, tokens.data(), 5, nullptr, 0,
                                                    &computed),
            PN_ERR_ALREADY_EXISTS);
  EXPECT_EQ(computed, -1);
}

// Calls the C++ layer rejects with an exception come back as statuses.
TEST(CApi, CppExceptionsBecomeStatuses) {
  Manager m = make_manager(8, 4);
  Builder b = make_builder(m.get());
  BatchHandle batch = make_batch();
  const auto tokens = iota(6, 0);
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 1, tokens.data(), 6), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 4), PN_OK);
  const int64_t ids[] = {1}, twice[] = {1, 1};
  const int32_t zero[] = {0, 0}, none[] = {0}, too_many[] = {6}, one[] = {1, 1};
  EXPECT_NO_THROW({
    EXPECT_EQ(pn_batch_builder_build(b.get(), ids, zero, none, 1, batch.get()),
              PN_ERR_INVALID_ARGUMENT);  // nothing scheduled
    EXPECT_TRUE(message_has("num_scheduled_tokens"));
    EXPECT_EQ(pn_batch_builder_build(b.get(), ids, zero, too_many, 1, batch.get()),
              PN_ERR_INVALID_ARGUMENT);  // the table covers 4 slots only
    EXPECT_EQ(pn_batch_builder_build(b.get(), twice, zero, one, 2, batch.get()),
              PN_ERR_INVALID_ARGUMENT);  // listed twice
  });

  Pool pool = make_pool(4);
  int32_t got[2];
  ASSERT_EQ(pn_block_pool_allocate(pool.get(), 2, got), PN_OK);
  int32_t refs = -1;
  EXPECT_NO_THROW({
    EXPECT_EQ(pn_block_pool_free(pool.get(), got, 2), PN_OK);
    EXPECT_EQ(pn_block_pool_free(pool.get(), got, 2), PN_ERR_INVALID_ARGUMENT);  // double free
    EXPECT_EQ(pn_block_pool_incr_ref(pool.get(), got, 1), PN_ERR_INVALID_ARGUMENT);  // free block
    EXPECT_EQ(pn_block_pool_ref_count(pool.get(), 9, &refs), PN_ERR_INVALID_ARGUMENT);
  });
  EXPECT_EQ(refs, -1);
}

TEST(CApi, LastErrorIsPerThreadAndClearedOnSuccess) {
  Manager m = make_manager(4, 4);
  EXPECT_EQ(pn_kv_cache_manager_free(m.get(), 5), PN_ERR_NOT_FOUND);
  EXPECT_TRUE(message_has("pn_kv_cache_manager_free"));
  std::string other = "unset";
  std::thread([&other] { other = pn_last_error_message(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_TRUE(message_has("pn_kv_cache_manager_free"));
  int64_t n = 0;
  ASSERT_EQ(pn_kv_cache_manager_num_blocks(m.get(), &n), PN_OK);
  EXPECT_STREQ(pn_last_error_message(), "");
}

// The same schedule through the C API and the C++ classes, step by step.
TEST(CApi, BatchEqualsCppBatchBuilder) {
  using paternoster::Batch;
  paternoster::KVCacheManager kv(32, 4);
  paternoster::BatchBuilder bb(kv);
  Manager m = make_manager(32, 4);
  Builder b = make_builder(m.get());
  BatchHandle batch = make_batch();

  const std::vector<int64_t> ids = {10, 20, 30};
  const std::vector<int64_t> lens = {10, 6, 8};
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto prompt = iota(lens[i], 100 * static_cast<int64_t>(i + 1));
    bb.add_request(ids[i], prompt);
    ASSERT_EQ(pn_batch_builder_add_request(b.get(), ids[i], prompt.data(), lens[i]), PN_OK);
  }
  // Step 1: a whole prompt, a prompt and a first prefill chunk; step 2:
  // decodes and the second chunk; step 3: decodes only.
  const std::vector<std::vector<int32_t>> computed = {{0, 0, 0}, {10, 6, 4}, {11, 7, 8}};
  const std::vector<std::vector<int32_t>> scheduled = {{10, 6, 4}, {1, 1, 4}, {1, 1, 1}};
  for (size_t step = 0; step < computed.size(); ++step) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t need = int64_t{computed[step][i]} + scheduled[step][i];
      ASSERT_TRUE(kv.allocate_slots(ids[i], need));
      ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), ids[i], need), PN_OK);
    }
    const Batch want = bb.build(ids, computed[step], scheduled[step]);
    ASSERT_EQ(pn_batch_builder_build(b.get(), ids.data(), computed[step].data(),
                                     scheduled[step].data(), 3, batch.get()),
              PN_OK)
        << pn_last_error_message();
    int64_t seqs = -1, tokens = -1, max_blocks = -1;
    ASSERT_EQ(pn_batch_shape(batch.get(), &seqs, &tokens, &max_blocks), PN_OK);
    EXPECT_EQ(seqs, want.shape.num_seqs);
    EXPECT_EQ(tokens, want.shape.num_tokens);
    EXPECT_EQ(max_blocks, want.shape.max_blocks);
    EXPECT_EQ(to_vector(pn_batch_input_ids, batch.get()), want.input_ids);
    EXPECT_EQ(to_vector(pn_batch_positions, batch.get()), want.positions);
    EXPECT_EQ(to_vector(pn_batch_slot_mapping, batch.get()), want.slot_mapping);
    EXPECT_EQ(to_vector(pn_batch_logits_indices, batch.get()), want.logits_indices);
    EXPECT_EQ(to_vector(pn_batch_block_tables, batch.get()), want.block_tables);
    EXPECT_EQ(to_vector(pn_batch_seq_lens, batch.get()), want.seq_lens);
    EXPECT_EQ(to_vector(pn_batch_query_start_loc, batch.get()), want.query_start_loc);

    // Sample: the request whose prefill is done gets one more token.
    std::vector<int64_t> next_ids, next_tokens;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (computed[step][i] + scheduled[step][i] < lens[i]) continue;
      next_ids.push_back(ids[i]);
      next_tokens.push_back(1000 + static_cast<int64_t>(step));
    }
    bb.append_tokens(next_ids.data(), next_tokens.data(), static_cast<int64_t>(next_ids.size()));
    ASSERT_EQ(pn_batch_builder_append_tokens(b.get(), next_ids.data(), next_tokens.data(),
                                             static_cast<int64_t>(next_ids.size())),
              PN_OK);
  }
  // Block tables agree too.
  for (int64_t id : ids) {
    int32_t table[32];
    int64_t len = -1;
    ASSERT_EQ(pn_kv_cache_manager_block_table(m.get(), id, table, 32, &len), PN_OK);
    EXPECT_EQ(std::vector<int32_t>(table, table + len), kv.block_table(id));
  }
}

TEST(CApi, FailedBuildLeavesEmptyBatch) {
  Manager m = make_manager(8, 4);
  Builder b = make_builder(m.get());
  BatchHandle batch = make_batch();
  const auto prompt = iota(5, 0);
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 1, prompt.data(), 5), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 5), PN_OK);
  const int64_t ids[] = {1};
  const int32_t computed[] = {0}, scheduled[] = {5}, too_many[] = {9};
  ASSERT_EQ(pn_batch_builder_build(b.get(), ids, computed, scheduled, 1, batch.get()), PN_OK);
  int64_t tokens = -1;
  ASSERT_EQ(pn_batch_shape(batch.get(), nullptr, &tokens, nullptr), PN_OK);
  EXPECT_EQ(tokens, 5);
  EXPECT_EQ(pn_batch_builder_build(b.get(), ids, computed, too_many, 1, batch.get()),
            PN_ERR_INVALID_ARGUMENT);
  int64_t seqs = -1, max_blocks = -1;
  ASSERT_EQ(pn_batch_shape(batch.get(), &seqs, &tokens, &max_blocks), PN_OK);
  EXPECT_EQ(seqs, 0);
  EXPECT_EQ(tokens, 0);
  EXPECT_EQ(max_blocks, 0);
  EXPECT_TRUE(to_vector(pn_batch_input_ids, batch.get()).empty());
  EXPECT_EQ(to_vector(pn_batch_query_start_loc, batch.get()), std::vector<int32_t>{0});
}

TEST(CApi, FreeRestoresFreeBlocks) {
  Manager m = make_manager(16, 4);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 9), PN_OK);   // 3 blocks
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 2, 16), PN_OK);  // 4 blocks
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 13), PN_OK);  // +1 block
  EXPECT_EQ(num_free(m.get()), 8);
  double usage = -1;
  ASSERT_EQ(pn_kv_cache_manager_usage(m.get(), &usage), PN_OK);
  EXPECT_DOUBLE_EQ(usage, 0.5);
  ASSERT_EQ(pn_kv_cache_manager_free(m.get(), 1), PN_OK);
  EXPECT_EQ(num_free(m.get()), 12);
  ASSERT_EQ(pn_kv_cache_manager_free(m.get(), 2), PN_OK);
  EXPECT_EQ(num_free(m.get()), 16);
  int64_t requests = -1;
  ASSERT_EQ(pn_kv_cache_manager_num_requests(m.get(), &requests), PN_OK);
  EXPECT_EQ(requests, 0);

  Pool pool = make_pool(4);
  int32_t ids[3];
  ASSERT_EQ(pn_block_pool_allocate(pool.get(), 3, ids), PN_OK);
  ASSERT_EQ(pn_block_pool_incr_ref(pool.get(), ids, 1), PN_OK);
  int32_t refs = 0;
  ASSERT_EQ(pn_block_pool_ref_count(pool.get(), ids[0], &refs), PN_OK);
  EXPECT_EQ(refs, 2);
  ASSERT_EQ(pn_block_pool_free(pool.get(), ids, 3), PN_OK);
  int64_t pool_free = -1;
  ASSERT_EQ(pn_block_pool_num_free_blocks(pool.get(), &pool_free), PN_OK);
  EXPECT_EQ(pool_free, 3);  // ids[0] still has one reference
  ASSERT_EQ(pn_block_pool_free(pool.get(), ids, 1), PN_OK);
  ASSERT_EQ(pn_block_pool_num_free_blocks(pool.get(), &pool_free), PN_OK);
  EXPECT_EQ(pool_free, 4);
}

TEST(CApi, BuilderKeepsManagerAlive) {
  pn_kv_cache_manager_t* m = nullptr;
  ASSERT_EQ(pn_kv_cache_manager_create(8, 4, 0, &m), PN_OK);
  Builder b = make_builder(m);
  const auto prompt = iota(3, 0);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m, 1, 3), PN_OK);
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 1, prompt.data(), 3), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_destroy(m), PN_OK);  // the builder still reads it
  BatchHandle batch = make_batch();
  const int64_t ids[] = {1};
  const int32_t computed[] = {0}, scheduled[] = {3};
  ASSERT_EQ(pn_batch_builder_build(b.get(), ids, computed, scheduled, 1, batch.get()), PN_OK);
  EXPECT_EQ(to_vector(pn_batch_seq_lens, batch.get()), std::vector<int32_t>{3});
}

TEST(CApi, PrefixCachingSharesBlocks) {
  Manager m = make_manager(8, 4, /*caching=*/1);
  const auto tokens = iota(10, 500);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots(m.get(), 1, 10), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_cache_blocks(m.get(), 1, tokens.data(), 10), PN_OK);
  int64_t computed = -1;
  ASSERT_EQ(pn_kv_cache_manager_get_computed_blocks(m.get(), 2, tokens.data(), 10, nullptr, 0,
                                                    &computed),
            PN_OK);
  EXPECT_EQ(computed, 8);  // two full blocks shared
  const char salt[] = "tenant-b";
  ASSERT_EQ(pn_kv_cache_manager_get_computed_blocks(m.get(), 3, tokens.data(), 10, salt,
                                                    sizeof(salt) - 1, &computed),
            PN_OK);
  EXPECT_EQ(computed, 0);  // another salt shares nothing
  int64_t queried = -1, hits = -1, cached = -1;
  ASSERT_EQ(pn_kv_cache_manager_prefix_cache_stats(m.get(), &queried, &hits, &cached), PN_OK);
  EXPECT_EQ(queried, 20);
  EXPECT_EQ(hits, 8);
  EXPECT_EQ(cached, 2);
  int64_t uncached = -1;
  ASSERT_EQ(pn_kv_cache_manager_reset_prefix_cache(m.get(), &uncached), PN_OK);
  EXPECT_EQ(uncached, 2);
  for (int64_t id : {1, 2, 3}) ASSERT_EQ(pn_kv_cache_manager_free(m.get(), id), PN_OK);
  EXPECT_EQ(num_free(m.get()), 8);
}

TEST(CApi, RecurrentGroupHoldsOneStateSlotPerRequest) {
  // A full-attention group and a recurrent-state group with 2 state slots.
  const int64_t windows[] = {0, 0};
  const int recurrent[] = {0, 1};
  pn_kv_cache_manager_t* raw = nullptr;
  EXPECT_EQ(pn_kv_cache_manager_create_hybrid(32, 4, 0, windows, recurrent, 2, 0, &raw),
            PN_ERR_INVALID_ARGUMENT);  // no state slots
  EXPECT_EQ(pn_kv_cache_manager_create_hybrid(32, 4, 1, windows, recurrent, 2, 2, &raw),
            PN_ERR_INVALID_ARGUMENT);  // prefix caching
  ASSERT_EQ(pn_kv_cache_manager_create_hybrid(32, 4, 0, windows, recurrent, 2, 2, &raw), PN_OK);
  Manager m(raw);
  int64_t free_slots = -1;
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 1, 9, 0), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 2, 3, 0), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_num_free_state_slots(m.get(), &free_slots), PN_OK);
  EXPECT_EQ(free_slots, 0);
  EXPECT_EQ(num_free(m.get()), 32 - 3 - 1);  // state slots take no blocks
  int32_t slot[4] = {-1, -1, -1, -1};
  int64_t len = 0;
  ASSERT_EQ(pn_kv_cache_manager_group_block_table(m.get(), 1, 1, slot, 4, &len), PN_OK);
  EXPECT_EQ(len, 1);
  EXPECT_TRUE(slot[0] == 0 || slot[0] == 1);
  // A third request finds blocks but no slot.
  EXPECT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 3, 3, 0), PN_ERR_OUT_OF_BLOCKS);
  ASSERT_EQ(pn_kv_cache_manager_free(m.get(), 1), PN_OK);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 3, 3, 0), PN_OK);
}

TEST(CApi, KVCacheGroupsMatchTheCppManager) {
  // A full group and a window-4 group over 32 blocks of 4, through the C API
  // and through the C++ classes, the same calls: the same tables and batch.
  const int64_t windows[] = {0, 4};
  pn_kv_cache_manager_t* raw = nullptr;
  const int64_t bad[] = {-1};
  EXPECT_EQ(pn_kv_cache_manager_create_grouped(8, 4, 0, bad, 1, &raw), PN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pn_kv_cache_manager_create_grouped(8, 4, 0, windows, 0, &raw),
            PN_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(pn_kv_cache_manager_create_grouped(32, 4, 0, windows, 2, &raw), PN_OK);
  Manager m(raw);
  paternoster::KVCacheManager kv(32, 4, false, {{0}, {4}});
  int64_t groups = 0;
  ASSERT_EQ(pn_kv_cache_manager_num_groups(m.get(), &groups), PN_OK);
  EXPECT_EQ(groups, 2);

  ASSERT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 7, 12, 0), PN_OK);
  ASSERT_TRUE(kv.allocate_slots(7, 12, 0));
  int64_t need = -1;
  int ok = -1;
  ASSERT_EQ(pn_kv_cache_manager_num_required_blocks_after(m.get(), 7, 13, 12, &need), PN_OK);
  EXPECT_EQ(need, kv.num_required_blocks(7, 13, 12));
  ASSERT_EQ(pn_kv_cache_manager_can_allocate_after(m.get(), 7, 13, 12, &ok), PN_OK);
  EXPECT_EQ(ok, 1);
  ASSERT_EQ(pn_kv_cache_manager_allocate_slots_after(m.get(), 7, 13, 12), PN_OK);
  ASSERT_TRUE(kv.allocate_slots(7, 13, 12));
  for (int64_t g = 0; g < 2; ++g) {
    int32_t ids[8];
    int64_t len = 0;
    ASSERT_EQ(pn_kv_cache_manager_group_block_table(m.get(), 7, g, ids, 8, &len), PN_OK);
    EXPECT_EQ(std::vector<int32_t>(ids, ids + len), kv.block_table(7, g));
  }
  int32_t ids[8];
  int64_t len = 0;
  EXPECT_EQ(pn_kv_cache_manager_group_block_table(m.get(), 7, 2, ids, 8, &len),
            PN_ERR_INVALID_ARGUMENT);

  pn_batch_builder_t* braw = nullptr;
  ASSERT_EQ(pn_batch_builder_create(m.get(), &braw), PN_OK);
  Builder b(braw);
  paternoster::BatchBuilder cpp(kv);
  std::vector<int64_t> tokens(13);
  for (int64_t i = 0; i < 13; ++i) tokens[i] = 50 + i;
  ASSERT_EQ(pn_batch_builder_add_request(b.get(), 7, tokens.data(), 13), PN_OK);
  cpp.add_request(7, tokens);
  pn_batch_t* batch_raw = nullptr;
  ASSERT_EQ(pn_batch_create(&batch_raw), PN_OK);
  BatchHandle batch(batch_raw);
  const int64_t req[] = {7};
  const int32_t computed[] = {12}, scheduled[] = {1};
  ASSERT_EQ(pn_batch_builder_build(b.get(), req, computed, scheduled, 1, batch.get()), PN_OK);
  const paternoster::Batch want = cpp.build({7}, {12}, {1});
  ASSERT_EQ(pn_batch_num_groups(batch.get(), &groups), PN_OK);
  EXPECT_EQ(groups, 2);
  const int64_t* slots = nullptr;
  const int32_t* tables = nullptr;
  ASSERT_EQ(pn_batch_group_slot_mapping(batch.get(), 1, &slots, &len), PN_OK);
  EXPECT_EQ(std::vector<int64_t>(slots, slots + len), want.group_slot_mapping);
  ASSERT_EQ(pn_batch_group_block_tables(batch.get(), 1, &tables, &len), PN_OK);
  EXPECT_EQ(std::vector<int32_t>(tables, tables + len), want.group_block_tables);
  EXPECT_EQ(tables[0], -1);  // block 0 released out of the window
  ASSERT_EQ(pn_batch_group_block_tables(batch.get(), 0, &tables, &len), PN_OK);
  EXPECT_EQ(std::vector<int32_t>(tables, tables + len), want.block_tables);
  EXPECT_EQ(pn_batch_group_slot_mapping(batch.get(), 2, &slots, &len), PN_ERR_INVALID_ARGUMENT);
}

}  // namespace
