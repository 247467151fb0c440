// CUDA paged attention and the KV cache write that feeds it: host-side
// launcher API. No torch, no Python: raw device pointers, sizes, strides and a
// cudaStream_t.
//
// Algorithms:
//   - PagedAttention (Kwon et al., "Efficient Memory Management for Large
//     Language Model Serving with PagedAttention", SOSP'23): K/V live in
//     fixed-size blocks addressed through per-sequence block tables.
//   - Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023): a decode's context is
//     split across thread blocks ("split-K"); each writes a partial
//     (max, sum, output) and a reduction kernel merges them.
//   - The online softmax of FlashAttention (Dao et al., 2022) inside every
//     kernel, so no buffer grows with the context length.
//
// Layouts (same as the CPU kernels, core/include/paternoster/attention.h):
//   query, out               [T, Hq, D]      token stride given (>= Hq*D), heads dense
//   key, value               [T, Hkv, D]     token stride given (>= Hkv*D), heads dense
//   key_cache, value_cache   [num_blocks, block_size, Hkv, D]   contiguous
//   block_tables             int32 [B, max_blocks_per_seq]      contiguous
//   seq_lens                 int32 [B]   context length including the new tokens
//   query_start_loc          int32 [B+1] sequence b owns query rows [qsl[b], qsl[b+1])
//   slot_mapping             int64 [T]   slot = block * block_size + offset; < 0 = skip
// Query row i of sequence b (q_len = qsl[b+1] - qsl[b]) sits at position
// seq_lens[b] - q_len + i and attends causally to positions 0..that position,
// or with a sliding window W > 0 to the W positions ending there (p - W < k <= p).
// GQA: query head h reads kv head h / (Hq / Hkv).
//
// Element types: float16 and bfloat16 (fp32 accumulation). float32 is not
// supported on the GPU (serving runs in 16-bit; the CPU kernels cover fp32).
// Head sizes: 64, 128 and 256 (Gemma 3). Block sizes: powers of two >= 8 (16
// and 32 are the tested ones). Every pointer 16-byte aligned, strides
// multiples of 8 elements.
//
// Device arrays are never read on the host (no synchronisation), so every
// launcher is usable under CUDA graph capture: nothing is allocated, and the
// split-K workspace is passed in by the caller (decode_workspace_bytes()).
// The price: index contents (block ids, seq_lens, slots) are trusted, not
// checked; the Python wrappers check shapes and dtypes, the C++ core's batch
// builder produces the indices.
//
// Errors: sizes, strides, alignment or dtypes that the kernels cannot handle
// throw std::invalid_argument (before anything is launched); a failed launch
// returns its cudaError_t (cudaSuccess otherwise).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace paternoster {
namespace cuda {

enum class DType : int32_t { kFloat16 = 0, kBFloat16 = 1 };

// Size in bytes of one element of `dtype` (2 for both).
int64_t dtype_size(DType dtype);

// Tokens per split are at least this many (shorter splits cost more in the
// reduction than they gain in parallelism).
constexpr int64_t kMinSplitTokens = 128;
// Most splits of one sequence's context (the reduction runs one warp over them).
constexpr int64_t kMaxSplits = 32;

// Arguments of reshape_and_cache(). All pointers device pointers.
struct CacheWriteArgs {
  const void* key = nullptr;    // [T, Hkv, D], token stride key_stride
  const void* value = nullptr;  // [T, Hkv, D], token stride value_stride
  void* key_cache = nullptr;    // [num_blocks, block_size, Hkv, D]
  void* value_cache = nullptr;  // same shape
  const int64_t* slot_mapping = nullptr;  // [T]
  int64_t num_tokens = 0;       // T
  int64_t num_kv_heads = 0;     // Hkv
  int64_t head_size = 0;        // D (any even size; 16-byte copies when D % 8 == 0)
  int64_t key_stride = 0;       // elements between tokens of key; 0 = Hkv * D
  int64_t value_stride = 0;     // elements between tokens of value; 0 = Hkv * D
  int64_t num_slots = 0;        // num_blocks * block_size; larger slots are skipped
  DType dtype = DType::kBFloat16;
};

// Copies key[t] / value[t] ([Hkv, D] each) into cache slot slot_mapping[t] for
// every t < num_tokens. A negative slot, or one >= num_slots, skips the token
// (the slots live on the device; checking them on the host would cost a sync).
// One thread block per token, 16-byte loads/stores.
// Throws std::invalid_argument for null pointers (with T > 0), non-positive
// sizes, an odd head size, strides below Hkv * D; returns the launch error.
cudaError_t reshape_and_cache(const CacheWriteArgs& args, cudaStream_t stream);

// The argument checks of reshape_and_cache() alone (no CUDA call): throws
// std::invalid_argument exactly when reshape_and_cache() would.
void check_cache_write_args(const CacheWriteArgs& args);

// Arguments of paged_attention(). All pointers device pointers.
struct PagedAttentionArgs {
  void* out = nullptr;                     // [T, Hq, D], token stride out_stride
  const void* query = nullptr;             // [T, Hq, D], token stride query_stride
  const void* key_cache = nullptr;         // [num_blocks, block_size, Hkv, D]
  const void* value_cache = nullptr;       // same shape
  const int32_t* block_tables = nullptr;   // [B, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;       // [B]
  const int32_t* query_start_loc = nullptr;  // [B + 1]
  int64_t num_tokens = 0;          // T
  int64_t num_seqs = 0;            // B (<= 65535)
  int64_t num_heads = 0;           // Hq, a multiple of Hkv
  int64_t num_kv_heads = 0;        // Hkv
  int64_t head_size = 0;           // D: 64, 128 or 256
  int64_t num_blocks = 0;          // cache's first dimension
  int64_t block_size = 0;          // power of two >= 8
  int64_t max_blocks_per_seq = 0;  // block_tables' second dimension
  int64_t query_stride = 0;        // elements between query tokens; 0 = Hq * D
  int64_t out_stride = 0;          // elements between out tokens; 0 = Hq * D
  // Upper bound of q_len over the sequences. 1 means every sequence is a
  // decode (or empty): only the decode kernel runs. 0 = num_tokens.
  int64_t max_query_len = 0;
  // Upper bound of seq_lens (sizes the split-K grid; a CUDA graph captures
  // with max_model_len). 0 = max_blocks_per_seq * block_size.
  int64_t max_seq_len = 0;
  float scale = 1.0f;              // softmax scale, usually D ** -0.5
  DType dtype = DType::kBFloat16;
  // Split-K scratch, 16-byte aligned, reused across calls; see
  // decode_workspace_bytes(). A smaller (or null) workspace lowers the
  // number of splits (down to 1, which needs none): slower, never wrong.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // Streaming multiprocessors of the device (the split count aims to fill
  // them); 0 = ask the CUDA runtime for the current device's.
  int32_t num_sms = 0;
  // Sliding window W: each query attends to its last W positions (itself
  // included); 0 = full causal attention. Block-table entries of blocks wholly
  // before the window of a sequence's first query row are not read (they may
  // be -1), and a decode reads O(W) tokens.
  int64_t sliding_window = 0;
  // Attention sinks (gpt-oss): float32 [Hq] device array, or null: none. Query
  // head h's logit s_h joins every row's softmax normalisation without a value
  // vector: out = sum_k exp(l_k - m) v_k / (sum_k exp(l_k - m) + exp(s_h - m)),
  // m = max(max_k l_k, s_h), l_k = scale * q.k over the keys the row sees (HF
  // transformers' gpt_oss eager attention). Not scaled; -inf = no sink. 4-byte
  // aligned.
  const float* sinks = nullptr;
};

// out = softmax(scale * Q K^T + causal mask [+ sink]) V per sequence and query
// head, reading K/V through the block tables. A sink enters once per (row,
// head) where the row is written: the decode kernel's epilogue when a sequence
// used one split, else the split-K reduction; the prefill kernel's epilogue.
//  - Sequences with q_len == 1 run the decode kernel: one thread block per
//    (sequence, kv head, split), handling all query heads of the GQA group so
//    K/V is read once per group; the context is split into up to
//    decode_num_splits() contiguous chunks (split-K), merged by a reduction
//    kernel when a sequence used more than one. A decode row whose seq_lens
//    entry is <= 0 is written as zeros (padding rows of a CUDA graph batch).
//  - Sequences with q_len > 1 (prompts, prefill chunks over cached context)
//    run the prefill kernel: tiles of 64 (query token x head) rows against
//    tiles of 32 keys with an online softmax (at D = 256 with 72.6 KiB of
//    dynamic shared memory per thread block, which the launcher opts in to:
//    sm_70, sm_80 and later allow it, sm_75's 64 KiB does not and the
//    launch returns cudaErrorInvalidValue).
//  - Rows of sequences with q_len == 0, and rows outside [qsl[0], qsl[B]),
//    are left untouched.
// Throws std::invalid_argument for null pointers, unsupported head size,
// block size or dtype, Hq not a multiple of Hkv, strides below Hq * D,
// misaligned pointers (sinks: 4 bytes), a negative sliding_window, or more than 65535
// sequences; returns the launch error.
cudaError_t paged_attention(const PagedAttentionArgs& args, cudaStream_t stream);

// The argument checks of paged_attention() alone (no CUDA call): throws
// std::invalid_argument exactly when paged_attention() would.
void check_paged_attention_args(const PagedAttentionArgs& args);

// Number of context splits the decode kernel uses for these sizes: enough
// thread blocks to fill `num_sms` multiprocessors, at most kMaxSplits, and no
// split shorter than kMinSplitTokens of a max_seq_len context. Before the
// workspace limit (paged_attention() lowers it to what fits).
int64_t decode_num_splits(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                          int64_t max_seq_len, int64_t num_sms);

// Workspace bytes that let paged_attention() use decode_num_splits() splits
// for every batch of 1..max_num_seqs sequences with contexts up to
// max_seq_len: max over B of B * Hq * splits(B) * (D + 2) * 4 (partial
// outputs, maxima and sums in float32), 0 when no batch splits. Allocate it
// once per (max batch, max context) and reuse it, also under graph capture.
// Throws std::invalid_argument for non-positive sizes, a head size other than
// 64, 128 or 256, or more than 65535 sequences (what paged_attention() refuses).
int64_t decode_workspace_bytes(int64_t max_num_seqs, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_size, int64_t max_seq_len, int64_t num_sms);

}  // namespace cuda
}  // namespace paternoster
