// A tiny C++ host embedding the Paternoster core without Python: it admits a
// few requests, allocates their KV blocks, runs three engine-like steps (one
// prefill step, then decodes) through BatchBuilder, writes fake K/V with
// reshape_and_cache, runs paged_attention, and prints what it did.
// Exits non-zero if anything is inconsistent (it doubles as a smoke test).
#include <cmath>
#include <cstdio>
#include <vector>

#include "paternoster/attention.h"
#include "paternoster/batch_builder.h"
#include "paternoster/kv_cache_manager.h"
#include "paternoster/thread_pool.h"

using namespace paternoster;

int main() {
  constexpr int64_t kBlocks = 64, kBlockSize = 16, kHq = 4, kHkv = 2, kD = 64;
  KVCacheManager kv(kBlocks, kBlockSize);
  BatchBuilder builder(kv);
  set_num_threads(2);

  // Three requests with prompts of 5, 20 and 33 tokens.
  std::vector<int64_t> ids = {7, 8, 9};
  std::vector<int32_t> computed = {0, 0, 0}, scheduled = {5, 20, 33};
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<int64_t> prompt(static_cast<size_t>(scheduled[i]));
    for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = static_cast<int64_t>(100 * i + t);
    builder.add_request(ids[i], prompt);
  }

  std::vector<float> key_cache(kBlocks * kBlockSize * kHkv * kD, 0.0f);
  std::vector<float> value_cache(key_cache.size(), 0.0f);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!kv.allocate_slots(ids[i], computed[i] + scheduled[i])) {
        std::fprintf(stderr, "out of blocks\n");
        return 1;
      }
    }
    Batch batch = builder.build(ids, computed, scheduled);
    const int64_t t_count = batch.shape.num_tokens;

    // Fake projections: K/V/Q values derived from the token id.
    std::vector<float> k(t_count * kHkv * kD), v(k.size()), q(t_count * kHq * kD), out(q.size());
    for (int64_t t = 0; t < t_count; ++t) {
      for (int64_t x = 0; x < kHkv * kD; ++x) {
        k[t * kHkv * kD + x] = std::sin(0.01f * batch.input_ids[t] + 0.1f * x);
        v[t * kHkv * kD + x] = std::cos(0.02f * batch.input_ids[t] + 0.05f * x);
      }
      for (int64_t x = 0; x < kHq * kD; ++x) q[t * kHq * kD + x] = 0.1f * std::sin(0.3f * x + t);
    }
    reshape_and_cache(k.data(), v.data(), key_cache.data(), value_cache.data(),
                      batch.slot_mapping.data(), t_count, kHkv, kD, kBlocks * kBlockSize,
                      DType::kFloat32);
    paged_attention(out.data(), q.data(), key_cache.data(), value_cache.data(),
                    batch.block_tables.data(), batch.seq_lens.data(), batch.query_start_loc.data(),
                    t_count, batch.shape.num_seqs, kHq, kHkv, kD, kBlocks, kBlockSize,
                    batch.shape.max_blocks, 1.0f / std::sqrt(static_cast<float>(kD)),
                    DType::kFloat32);
    for (float x : out) {
      if (!std::isfinite(x) || std::fabs(x) > 1.0f + 1e-5f) {
        std::fprintf(stderr, "attention output out of range: %f\n", x);
        return 1;
      }
    }
    std::printf("step %d: %lld tokens, %lld seqs, max %lld blocks/seq, KV usage %.3f (%s)\n", step,
                static_cast<long long>(t_count), static_cast<long long>(batch.shape.num_seqs),
                static_cast<long long>(batch.shape.max_blocks), kv.usage(), attention_isa());

    // "Sample" one token per request and move on to decoding.
    std::vector<int64_t> next(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      next[i] = static_cast<int64_t>(1000 + step);
      computed[i] += scheduled[i];
      scheduled[i] = 1;
    }
    builder.append_tokens(ids.data(), next.data(), static_cast<int64_t>(ids.size()));
  }
  for (int64_t id : ids) {
    kv.free(id);
    builder.remove_request(id);
  }
  if (kv.num_free_blocks() != kBlocks) {
    std::fprintf(stderr, "blocks leaked\n");
    return 1;
  }
  std::printf("all %lld blocks free again\n", static_cast<long long>(kBlocks));
  return 0;
}
