// Paged attention driver: argument checks, the split into work items, the
// choice of SIMD variant, and reshape_and_cache.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_kernel.h"
#include "paternoster/attention.h"
#include "paternoster/thread_pool.h"

namespace paternoster {

namespace {

using detail::AttnItem;
using detail::AttnParams;
using detail::AttnTileFn;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require_positive(int64_t v, const char* name) {
  if (v <= 0) fail(std::string(name) + " must be > 0, got " + std::to_string(v));
}

struct Isa {
  AttnTileFn fn;
  const char* name;
};

// Variants compiled in and supported by this CPU, best first.
std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
#if defined(PATERNOSTER_HAVE_AVX512) || defined(PATERNOSTER_HAVE_AVX2)
  __builtin_cpu_init();
#endif
#if defined(PATERNOSTER_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    isas.push_back({detail::avx512::attention_tile, "avx512"});
  }
#endif
#if defined(PATERNOSTER_HAVE_AVX2)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    isas.push_back({detail::avx2::attention_tile, "avx2"});
  }
#endif
  isas.push_back({detail::baseline::attention_tile, "baseline"});
  return isas;
}

// The best variant, or the one named by $PATERNOSTER_CPU_ISA if available.
Isa select_isa() {
  const auto isas = available_isas();
  if (const char* want = std::getenv("PATERNOSTER_CPU_ISA")) {
    for (const Isa& i : isas) {
      if (std::strcmp(i.name, want) == 0) return i;
    }
  }
  return isas.front();
}

const Isa& isa() {
  static const Isa chosen = select_isa();
  return chosen;
}

void run_paged_attention(AttnTileFn tile_fn, void* out, const void* query, const void* key_cache,
                         const void* value_cache, const int32_t* block_tables,
                         const int32_t* seq_lens, const int32_t* query_start_loc,
                         int64_t num_tokens, int64_t num_seqs, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_size, int64_t num_blocks,
                         int64_t block_size, int64_t max_blocks_per_seq, float scale, DType dtype,
                         bool batch_invariant, int64_t sliding_window, const float* sinks);

// Rows (query tokens x heads of one kv group) per work item for prefill: big
// enough that each K/V block is converted once for many rows (and fills the
// wide kernel's row vectors), small enough to stay in L1/L2 and to give the
// threads several items each.
constexpr int64_t kTileRows = 64;

// Below this many (query row, key) pairs a call runs on the calling thread
// alone: waking a worker costs tens of microseconds, about what this much
// work takes.
constexpr int64_t kMinParallelPairs = 16384;

// First position a query at `pos` attends to under sliding window `window`
// (0: no window).
int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// Per-thread scratch, grown on demand.
float* thread_scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

}  // namespace

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
  }
  fail("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

const char* attention_isa() { return isa().name; }

void paged_attention(void* out, const void* query, const void* key_cache,
                     const void* value_cache, const int32_t* block_tables,
                     const int32_t* seq_lens, const int32_t* query_start_loc, int64_t num_tokens,
                     int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                     int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq,
                     float scale, DType dtype, bool batch_invariant, int64_t sliding_window,
                     const float* sinks) {
  run_paged_attention(isa().fn, out, query, key_cache, value_cache, block_tables, seq_lens,
                      query_start_loc, num_tokens, num_seqs, num_heads, num_kv_heads, head_size,
                      num_blocks, block_size, max_blocks_per_seq, scale, dtype, batch_invariant,
                      sliding_window, sinks);
}

namespace detail {

std::vector<std::string> available_attention_isas() {
  std::vector<std::string> names;
  for (const Isa& i : available_isas()) names.emplace_back(i.name);
  return names;
}

void paged_attention_isa(const char* isa_name, void* out, const void* query,
                         const void* key_cache, const void* value_cache,
                         const int32_t* block_tables, const int32_t* seq_lens,
                         const int32_t* query_start_loc, int64_t num_tokens, int64_t num_seqs,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                         int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq,
                         float scale, DType dtype, bool batch_invariant,
                         int64_t sliding_window, const float* sinks) {
  for (const Isa& i : available_isas()) {
    if (std::strcmp(i.name, isa_name) == 0) {
      run_paged_attention(i.fn, out, query, key_cache, value_cache, block_tables, seq_lens,
                          query_start_loc, num_tokens, num_seqs, num_heads, num_kv_heads,
                          head_size, num_blocks, block_size, max_blocks_per_seq, scale, dtype,
                          batch_invariant, sliding_window, sinks);
      return;
    }
  }
  fail(std::string("attention ISA variant not available: ") + isa_name);
}

}  // namespace detail

namespace {

void run_paged_attention(AttnTileFn tile_fn, void* out, const void* query, const void* key_cache,
                         const void* value_cache, const int32_t* block_tables,
                         const int32_t* seq_lens, const int32_t* query_start_loc,
                         int64_t num_tokens, int64_t num_seqs, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_size, int64_t num_blocks,
                         int64_t block_size, int64_t max_blocks_per_seq, float scale, DType dtype,
                         bool batch_invariant, int64_t sliding_window, const float* sinks) {
  dtype_size(dtype);
  if (sliding_window < 0) {
    fail("sliding_window must be >= 0 (0 = no window), got " + std::to_string(sliding_window));
  }
  if (num_tokens < 0) fail("num_tokens must be >= 0");
  if (num_seqs < 0) fail("num_seqs must be >= 0");
  require_positive(num_heads, "num_heads");
  require_positive(num_kv_heads, "num_kv_heads");
  require_positive(head_size, "head_size");
  require_positive(block_size, "block_size");
  if (num_blocks < 0) fail("num_blocks must be >= 0");
  if (max_blocks_per_seq < 0) fail("max_blocks_per_seq must be >= 0");
  if (num_heads % num_kv_heads != 0) {
    fail("num_heads (" + std::to_string(num_heads) + ") must be a multiple of num_kv_heads (" +
         std::to_string(num_kv_heads) + ")");
  }
  if (!query_start_loc || !seq_lens) fail("query_start_loc and seq_lens must not be null");
  if (num_seqs == 0) return;

  // Check every sequence.
  const int64_t group = num_heads / num_kv_heads;
  int64_t work = 0;  // (query row, key) pairs, causal mask ignored
  int64_t longest = 0;  // the longest context
  if (query_start_loc[0] < 0) fail("query_start_loc[0] must be >= 0");
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = int64_t{query_start_loc[b + 1]} - query_start_loc[b];
    const std::string at = "sequence " + std::to_string(b) + ": ";
    if (q_len < 0) fail(at + "query_start_loc must be non-decreasing");
    if (query_start_loc[b + 1] > num_tokens) {
      fail(at + "query_start_loc exceeds num_tokens (" + std::to_string(num_tokens) + ")");
    }
    const int64_t seq_len = seq_lens[b];
    if (seq_len < q_len) {
      fail(at + "seq_lens (" + std::to_string(seq_len) + ") < query length (" +
           std::to_string(q_len) + ")");
    }
    if (q_len == 0) continue;
    const int64_t blocks = (seq_len + block_size - 1) / block_size;
    if (blocks > max_blocks_per_seq) {
      fail(at + "seq_lens (" + std::to_string(seq_len) + ") needs " + std::to_string(blocks) +
           " blocks, block_tables has " + std::to_string(max_blocks_per_seq) + " columns");
    }
    if (!block_tables) fail("block_tables must not be null");
    const int32_t* row = block_tables + b * max_blocks_per_seq;
    // Blocks wholly before the window of the first query row are never read.
    const int64_t first = window_start(seq_len - q_len, sliding_window) / block_size;
    for (int64_t j = first; j < blocks; ++j) {
      if (row[j] < 0 || row[j] >= num_blocks) {
        fail(at + "block_tables[" + std::to_string(b) + ", " + std::to_string(j) + "] = " +
             std::to_string(row[j]) + " out of range [0, " + std::to_string(num_blocks) + ")");
      }
    }
    const bool windowed = sliding_window > 0 && sliding_window < seq_len;
    work += q_len * (windowed ? std::min(seq_len, sliding_window + q_len) : seq_len) * num_heads;
    longest = std::max(longest, seq_len);
  }
  if (work == 0) return;
  if (!out || !query || !key_cache || !value_cache || !block_tables) {
    fail("out, query, key_cache, value_cache and block_tables must not be null");
  }
  const bool parallel = work >= kMinParallelPairs && default_thread_pool().num_threads() > 1;

  // Work items: per sequence and kv head, tiles of query tokens from the last
  // (longest context) to the first, so the dynamic schedule starts with the
  // big items. Decodes (few rows) are one tile. Batch-invariant: one token a
  // tile, so every token takes the same path whatever its neighbours.
  const int64_t tile_tokens = batch_invariant ? 1 : std::max<int64_t>(1, kTileRows / group);
  std::vector<AttnItem> items;
  int64_t max_rows = 1;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = int64_t{query_start_loc[b + 1]} - query_start_loc[b];
    const int64_t tiles = (q_len + tile_tokens - 1) / tile_tokens;
    for (int64_t tile = tiles - 1; tile >= 0; --tile) {
      const int64_t q0 = tile * tile_tokens;
      const int64_t q1 = std::min(q_len, q0 + tile_tokens);
      max_rows = std::max(max_rows, (q1 - q0) * group);
      for (int64_t g = 0; g < num_kv_heads; ++g) {
        items.push_back({static_cast<int32_t>(b), static_cast<int32_t>(g),
                         static_cast<int32_t>(q0), static_cast<int32_t>(q1)});
      }
    }
  }
  const auto num_items = static_cast<int64_t>(items.size());

  const AttnParams params{out,          query,          key_cache,  value_cache,
                          block_tables, seq_lens,       query_start_loc,
                          num_heads,    num_kv_heads,   head_size,  block_size,
                          max_blocks_per_seq,           scale,      dtype,
                          // a window covering every context is none (and
                          // keeps the kernel's position arithmetic small)
                          sliding_window < longest ? sliding_window : 0,
                          sinks};
  const size_t scratch_floats = detail::attn_scratch_floats(max_rows, head_size, block_size);
  auto run_item = [&](int64_t i) {
    tile_fn(params, items[static_cast<size_t>(i)], thread_scratch(scratch_floats));
  };
  if (!parallel) {
    for (int64_t i = 0; i < num_items; ++i) run_item(i);
  } else {
    default_thread_pool().parallel_for(num_items, run_item);
  }
}

}  // namespace

void reshape_and_cache(const void* key, const void* value, void* key_cache, void* value_cache,
                       const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                       int64_t head_size, int64_t num_slots, DType dtype) {
  const int64_t elem = dtype_size(dtype);
  if (num_tokens < 0) fail("num_tokens must be >= 0");
  require_positive(num_kv_heads, "num_kv_heads");
  require_positive(head_size, "head_size");
  if (num_slots < 0) fail("num_slots must be >= 0");
  if (num_tokens == 0) return;
  if (!key || !value || !key_cache || !value_cache || !slot_mapping) {
    fail("key, value, key_cache, value_cache and slot_mapping must not be null");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] >= num_slots) {
      fail("slot_mapping[" + std::to_string(t) + "] = " + std::to_string(slot_mapping[t]) +
           " out of range (cache has " + std::to_string(num_slots) + " slots)");
    }
  }
  const int64_t row_bytes = num_kv_heads * head_size * elem;
  const auto* k = static_cast<const char*>(key);
  const auto* v = static_cast<const char*>(value);
  auto* kc = static_cast<char*>(key_cache);
  auto* vc = static_cast<char*>(value_cache);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    std::memcpy(kc + slot * row_bytes, k + t * row_bytes, static_cast<size_t>(row_bytes));
    std::memcpy(vc + slot * row_bytes, v + t * row_bytes, static_cast<size_t>(row_bytes));
  }
}

}  // namespace paternoster
