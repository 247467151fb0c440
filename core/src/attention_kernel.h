// Internal interface between the attention driver (attention_cpu.cc: checks,
// work split, threads) and the per-ISA tile kernels (attention_isa_*.cc, each
// compiling attention_kernel.inc with its own SIMD width and -march).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "paternoster/attention.h"

namespace paternoster {
namespace detail {

struct AttnParams {
  void* out;
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_size;
  int64_t block_size;
  int64_t max_blocks_per_seq;
  float scale;
  DType dtype;
  int64_t window;  // sliding window W (> 0), or 0: full causal attention
  const float* sinks;  // [num_heads] sink logits, or null: none
};

// One work item: query tokens [q_begin, q_end) (relative to the sequence's
// first query row) of sequence `seq`, for all query heads that share kv head
// `kv_head`. (Items spanning all kv heads of a decode, which read each block's
// token rows whole, measured slower: the hardware prefetchers already bring
// the neighbouring heads' rows.)
struct AttnItem {
  int32_t seq;
  int32_t kv_head;
  int32_t q_begin;
  int32_t q_end;
};

// Items with more rows (tokens x group) than this take the wide path.
constexpr int64_t kNarrowMaxRows = 8;

// Padding every kernel variant uses (two of the widest SIMD vectors, in floats).
constexpr int64_t kPadFloats = 32;
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Floats of scratch a tile of `rows` query rows needs (any alignment; no
// initialisation needed).
inline size_t attn_scratch_floats(int64_t rows, int64_t head_size, int64_t block_size) {
  const int64_t dp = round_up(head_size, kPadFloats);
  const int64_t bp = round_up(block_size, kPadFloats);
  const int64_t rp = round_up(rows, kPadFloats);
  // Wide layout (the larger): q^T, acc: rp*dp; m, l, alpha, row positions: rp;
  // scores: bp*max(rp, 4); k, v: bp*dp each.
  return static_cast<size_t>(2 * rp * dp + 4 * rp + bp * (rp > 4 ? rp : 4) + 2 * bp * dp +
                             kPadFloats);
}

using AttnTileFn = void (*)(const AttnParams&, const AttnItem&, float* scratch);

namespace baseline { void attention_tile(const AttnParams&, const AttnItem&, float*); }
namespace avx2 { void attention_tile(const AttnParams&, const AttnItem&, float*); }
namespace avx512 { void attention_tile(const AttnParams&, const AttnItem&, float*); }

// For tests and benchmarks: the variants this build and CPU can run, best
// first ("avx512", "avx2", "baseline"), and paged_attention forced to one of
// them (std::invalid_argument if unavailable). $PATERNOSTER_CPU_ISA, read once,
// forces the variant paged_attention uses.
std::vector<std::string> available_attention_isas();
void paged_attention_isa(const char* isa, void* out, const void* query, const void* key_cache,
                         const void* value_cache, const int32_t* block_tables,
                         const int32_t* seq_lens, const int32_t* query_start_loc,
                         int64_t num_tokens, int64_t num_seqs, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_size, int64_t num_blocks,
                         int64_t block_size, int64_t max_blocks_per_seq, float scale, DType dtype,
                         bool batch_invariant = false, int64_t sliding_window = 0,
                         const float* sinks = nullptr);

}  // namespace detail
}  // namespace paternoster
