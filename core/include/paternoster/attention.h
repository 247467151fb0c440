// CPU paged attention and the KV cache write that feeds it.
//
// Algorithm: PagedAttention (Kwon et al., SOSP'23) for the KV layout and
// block-table indirection; online softmax in the style of FlashAttention (Dao
// et al., 2022) so no buffer grows with the context length.
//
// All arrays are contiguous and row-major:
//   query, out               [T, Hq, D]
//   key, value               [T, Hkv, D]
//   key_cache, value_cache   [num_blocks, block_size, Hkv, D]
//   block_tables             int32 [B, max_blocks_per_seq]
//   seq_lens                 int32 [B]   context length including the new tokens
//   query_start_loc          int32 [B+1] sequence b owns query rows
//                                        [qsl[b], qsl[b+1])
//   slot_mapping             int64 [T]   slot = block * block_size + offset
// Element type: float32, or bfloat16 stored as uint16 (accumulation is float32).
// Query row i of sequence b (q_len = qsl[b+1] - qsl[b]) sits at position
// seq_lens[b] - q_len + i and attends causally to positions 0..that position,
// or with a sliding window W > 0 to the W positions ending there (p - W < k <= p,
// the sliding-window causal mask of HF transformers). One call can mix whole
// prompts, prefill chunks over cached context and single decode tokens.
// GQA: query head h reads kv head h / (Hq / Hkv).
#pragma once

#include <cstdint>

namespace paternoster {

enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1 };

// Size in bytes of one element of `dtype`.
int64_t dtype_size(DType dtype);

// out = softmax(scale * Q K^T + causal mask [, sink]) V, per sequence and head,
// reading K/V through the block tables. Runs on default_thread_pool(), parallel over
// (sequence, kv head, tile of query rows). num_tokens is T (rows of query and
// out); num_blocks is the cache's first dimension (block ids are checked
// against it). Rows of `out` outside [qsl[0], qsl[B]) are left untouched.
// Throws std::invalid_argument (before touching `out`) for null pointers,
// non-positive sizes, Hq not a multiple of Hkv, a non-monotonic or
// out-of-range query_start_loc, seq_lens[b] < q_len, more than
// max_blocks_per_seq * block_size context, or a block id out of range.
// batch_invariant: every query token is its own work item, so a row's result
// (its reduction order over the keys) does not depend on how the step's rows
// are grouped: the same bits whether the token is decoded, prefilled whole or
// in chunks, or recomputed after a prefix-cache hit or a preemption (prefill
// reads each K/V block once per token instead of once per tile: slower).
// sliding_window: W > 0 limits each query to its last W positions (itself
// included); 0 = full causal attention; negative throws. Block-table entries
// of blocks wholly before the window of a sequence's first query row (every
// position < first position - W + 1) are neither read nor checked (a cache
// manager may have freed them and written -1), so a decode costs O(W).
// sinks: null, or float32 [num_heads]: query head h's attention-sink logit s_h
// (gpt-oss; Xiao et al., "Efficient Streaming Language Models with Attention
// Sinks", 2023) joins the softmax's normalisation without a value vector:
//   out = sum_k exp(l_k - m) v_k / (sum_k exp(l_k - m) + exp(s_h - m)),
//   m = max(max_k l_k, s_h), l_k = scale * q.k over the keys the query sees
// (HF transformers' gpt_oss eager attention: the sink is one more column of the
// logits, softmaxed, then dropped). s_h is not scaled; -inf is no sink. It
// enters once per (query row, head) when the row is written, so it keeps
// batch_invariant's guarantee, and a call without sinks keeps its bits.
void paged_attention(void* out, const void* query, const void* key_cache,
                     const void* value_cache, const int32_t* block_tables,
                     const int32_t* seq_lens, const int32_t* query_start_loc, int64_t num_tokens,
                     int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                     int64_t num_blocks, int64_t block_size, int64_t max_blocks_per_seq,
                     float scale, DType dtype, bool batch_invariant = false,
                     int64_t sliding_window = 0, const float* sinks = nullptr);

// Copies key[t] / value[t] (each [Hkv, D]) into cache slot slot_mapping[t] for
// t < num_tokens; a negative slot skips the token. num_slots is
// num_blocks * block_size. Throws std::invalid_argument (before writing) for
// null pointers, bad sizes or a slot >= num_slots.
void reshape_and_cache(const void* key, const void* value, void* key_cache, void* value_cache,
                       const int64_t* slot_mapping, int64_t num_tokens, int64_t num_kv_heads,
                       int64_t head_size, int64_t num_slots, DType dtype);

// Which SIMD variant of the attention kernel this CPU runs: "avx512",
// "avx2" or "baseline".
const char* attention_isa();

}  // namespace paternoster
