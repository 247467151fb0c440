// Device helpers shared by the kernels: 16-bit <-> float conversion of packed
// pairs, 16-byte vector loads, warp reductions, and the kernel parameter
// blocks (plain structs passed by value).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "paternoster/cuda_attention.h"

namespace paternoster {
namespace cuda {
namespace detail {

// log2(e): scores are kept in the base-2 domain so exp() becomes one exp2f.
constexpr float kLog2e = 1.4426950408889634f;

// Two 16-bit values packed in one 32-bit word <-> float2, per element type.
template <typename T>
struct Pack;

template <>
struct Pack<__half> {
  static __device__ __forceinline__ float2 to_float2(uint32_t w) {
    __half2 h;
    __builtin_memcpy(&h, &w, sizeof(w));
    return __half22float2(h);
  }
  static __device__ __forceinline__ __half from_float(float a) { return __float2half_rn(a); }
  static __device__ __forceinline__ uint32_t from_float2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    uint32_t w;
    __builtin_memcpy(&w, &h, sizeof(w));
    return w;
  }
};

template <>
struct Pack<__nv_bfloat16> {
  // bfloat16 is the top half of a float32: two shifts, no conversion unit.
  static __device__ __forceinline__ float2 to_float2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float a) {
    return __float2bfloat16_rn(a);
  }
  static __device__ __forceinline__ uint32_t from_float2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    uint32_t w;
    __builtin_memcpy(&w, &h, sizeof(w));
    return w;
  }
};

// 16 bytes (8 elements) through the read-only data path.
__device__ __forceinline__ uint4 load16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

// 8 elements packed in a uint4 -> 8 floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const float2 a = Pack<T>::to_float2(v.x);
  const float2 b = Pack<T>::to_float2(v.y);
  const float2 c = Pack<T>::to_float2(v.z);
  const float2 d = Pack<T>::to_float2(v.w);
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
  f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
}

// 8 floats -> 8 elements packed in a uint4 (round to nearest even).
template <typename T>
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 v;
  v.x = Pack<T>::from_float2(f[0], f[1]);
  v.y = Pack<T>::from_float2(f[2], f[3]);
  v.z = Pack<T>::from_float2(f[4], f[5]);
  v.w = Pack<T>::from_float2(f[6], f[7]);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Tokens of split `z`'s chunk: the context of `seq_len` tokens is cut into
// chunks of split_chunk_len(seq_len, splits) tokens (a multiple of 32, at least
// kMinSplitTokens); the last chunk may be shorter, trailing splits may be empty.
// Host and device agree on this function, so the reduction kernel knows how
// many splits a sequence used without any bookkeeping in memory.
__host__ __device__ __forceinline__ int split_chunk_len(int seq_len, int splits) {
  int len = (seq_len + splits - 1) / splits;
  len = (len + 31) & ~31;
  return len < static_cast<int>(kMinSplitTokens) ? static_cast<int>(kMinSplitTokens) : len;
}

// First position a query at `pos` attends to under sliding window `window`
// (0: no window).
__host__ __device__ __forceinline__ int window_start(int pos, int window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// The factor that turns an accumulator into a row's output when the softmax
// also has a sink logit `sink2` (base 2, no value vector), given the row's
// running maximum and sum of exp2(score - maximum) over its keys:
// alpha / (sum alpha + exp2(sink2 - mx)), mx = max(maximum, sink2),
// alpha = exp2(maximum - mx).
__device__ __forceinline__ float sink_scale(float sum, float maximum, float sink2) {
  const float mx = fmaxf(maximum, sink2);
  const float alpha = exp2f(maximum - mx);
  return alpha / (sum * alpha + exp2f(sink2 - mx));
}

// Decode kernel parameters (see decode_attention.cu).
struct DecodeParams {
  void* out;
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  float* part_out;  // [B, Hq, splits, D] normalised partial outputs
  float* part_max;  // [B, Hq, splits]    base-2 running maxima
  float* part_sum;  // [B, Hq, splits]    sums of exp2(score - max)
  const float* sinks;  // [Hq] sink logits (natural log), or null
  int64_t query_stride;
  int64_t out_stride;
  int64_t block_stride;  // elements between cache blocks (block_size * Hkv * D)
  int64_t token_stride;  // elements between cache tokens (Hkv * D)
  int max_blocks_per_seq;
  int num_heads;
  int group;        // Hq / Hkv
  int head_chunks;  // ceil(group / GMAX): thread blocks per kv head
  int log2_block_size;
  int splits;
  int window;        // sliding window W > 0, or 0: full causal attention
  float scale_log2;  // scale * log2(e)
};

// Prefill kernel parameters (see prefill_attention.cu).
struct PrefillParams {
  void* out;
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const int32_t* query_start_loc;
  int64_t query_stride;
  int64_t out_stride;
  int64_t block_stride;
  int64_t token_stride;
  int max_blocks_per_seq;
  int group;            // Hq / Hkv
  int heads_per_chunk;  // query heads of one kv head in one thread block
  int head_chunks;      // ceil(group / heads_per_chunk)
  int tile_tokens;      // query tokens per thread block (64 / heads_per_chunk)
  int log2_block_size;
  int window;  // sliding window W > 0, or 0: full causal attention
  float scale_log2;
  const float* sinks;  // [Hq] sink logits (natural log), or null
};

// Launchers (defined next to their kernels). Sizes are already validated.
cudaError_t launch_reshape_and_cache(const CacheWriteArgs& a, cudaStream_t stream);
cudaError_t launch_decode(const DecodeParams& p, int dtype, int head_size, int gmax,
                          int num_seqs, int num_kv_heads, cudaStream_t stream);
cudaError_t launch_prefill(const PrefillParams& p, int dtype, int head_size, int num_seqs,
                           int num_kv_heads, int max_query_len, cudaStream_t stream);

}  // namespace detail
}  // namespace cuda
}  // namespace paternoster
