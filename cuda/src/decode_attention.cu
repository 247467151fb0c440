// Paged decode attention (one query token per sequence) with split-K.
//
// Thread block = (sequence b, kv head, chunk of up to GMAX query heads of its
// GQA group, split z). The block streams the K/V rows of its slice of the
// context once and applies them to all its query heads, so a GQA group costs
// one read of its K/V (PagedAttention, Kwon et al. SOSP'23, for the paging;
// Flash-Decoding, Dao et al. 2023, for the split of the context across thread
// blocks plus a reduction).
//
// Inside a block (128 threads = 4 warps): a token row of one kv head is D
// contiguous elements; D/8 lanes read it with one 16-byte load each, so a warp
// covers 32/(D/8) token rows per step (4, 2, 1 for D = 64, 128, 256) and every
// thread keeps kUnroll loads in flight. The split's tokens are processed in
// partitions of kPartition tokens:
//   1. scores s = (q . k) * scale * log2(e) for every token and query head of
//      the partition, reduced across the D/8 lanes with shuffles, staged in
//      shared memory;
//   2. the partition's maximum and sum of exp2(s - max), merged into the
//      running (max, sum) with the online-softmax rescaling of FlashAttention;
//   3. acc += p * v with each thread owning 8 output dimensions of its token
//      rows; fp32 throughout.
// At the end the token slots (shuffles) and the warps (shared memory) are
// summed. A sequence that used one split writes `out` directly; otherwise each
// split writes its normalised partial output with its (max, sum) and
// decode_reduce_kernel merges them: out = sum_z w_z o_z / sum_z w_z with
// w_z = sum_z * exp2(max_z - max).
// An attention sink (gpt-oss: a per-head logit in the normalisation, no value)
// enters where the row is finished: this kernel's epilogue for one split, the
// reduction's weights (max and total include it) for several.
// With a sliding window W the context read is the last W positions, split the
// same way; the blocks before it are never touched.
#include <cfloat>

#include "common.cuh"

namespace paternoster {
namespace cuda {
namespace detail {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPartition = 512;  // tokens whose scores are staged at once
constexpr int kUnroll = 8;       // token rows in flight per thread and step
// Block ids one partition can touch (block sizes >= 8; +1 for an unaligned start).
constexpr int kMaxPartitionBlocks = kPartition / 8 + 1;

// Resident blocks per SM the register allocation must allow (2 for the widest
// GQA chunk, whose 2 x 64 accumulator and query registers would spill otherwise).
// The same for every D: a thread owns 8 dimensions of its token rows whatever
// D is, so its registers (GMAX x (8 accumulators + 4 packed query words) +
// kUnroll x 4 load words) do not grow with D.
template <int GMAX>
constexpr int min_blocks() { return GMAX <= 4 ? 4 : 2; }

// Floats of shared memory per query head: its kPartition staged scores, and
// at the end the kWarps partial outputs of D floats each, which alias them
// (kWarps * D = 1024 > kPartition for D = 256).
//
// Shared-memory budget per thread block (static, below the 48 KiB that needs
// no opt-in): GMAX * kHeadFloats<D> * 4 bytes + ~0.6 KiB (block ids, per-warp
// maxima and sums): D = 64 / 128: 2 KiB per head, 16.6 KiB at GMAX = 8;
// D = 256: 4 KiB per head, 32.6 KiB at GMAX = 8, so an H100/H200 SM (228 KiB)
// holds 6 such blocks, more than the registers allow (4 at GMAX <= 4, 2 at
// GMAX = 8, 128 threads each). ptxas (CUDA 13.0, sm_90, -O3) registers at
// GMAX = 1 / 2 / 4 / 8: 95-114 / 110 / 128 / 231-234 for every D, no spills.
template <int D>
constexpr int kHeadFloats = kPartition > kWarps * D ? kPartition : kWarps * D;

// q . k for 8 dimensions: q packed 16-bit, k unpacked, fp32 accumulation.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& q, const float (&k)[8]) {
  const float2 a = Pack<T>::to_float2(q.x);
  const float2 b = Pack<T>::to_float2(q.y);
  const float2 c = Pack<T>::to_float2(q.z);
  const float2 d = Pack<T>::to_float2(q.w);
  float s = a.x * k[0];
  s = fmaf(a.y, k[1], s);
  s = fmaf(b.x, k[2], s);
  s = fmaf(b.y, k[3], s);
  s = fmaf(c.x, k[4], s);
  s = fmaf(c.y, k[5], s);
  s = fmaf(d.x, k[6], s);
  return fmaf(d.y, k[7], s);
}

template <typename T, int D, int GMAX>
__global__ void __launch_bounds__(kThreads, min_blocks<GMAX>())
    paged_decode_kernel(const DecodeParams p) {
  constexpr int LPT = D / 8;          // lanes per token row
  constexpr int TPW = 32 / LPT;       // token rows per warp and step
  constexpr int ROWS = kWarps * TPW;  // token rows per block and step
  static_assert(D % 8 == 0 && 32 % LPT == 0, "a token row is 16-byte chunks of one warp");
  static_assert(kWarps * D <= kHeadFloats<D>, "the reduction buffer aliases the scores");

  // [GMAX][kPartition] (row stride kPartition); then [kWarps][GMAX][D]
  // (float4 accesses: 16-byte aligned)
  __shared__ __align__(16) float scores[GMAX * kHeadFloats<D>];
  __shared__ int blocks[kMaxPartitionBlocks];
  __shared__ float red_max[kWarps][GMAX];
  __shared__ float red_sum[kWarps][GMAX];
  __shared__ float fin_max[GMAX];
  __shared__ float fin_sum[GMAX];

  const int b = blockIdx.y;
  const int z = blockIdx.z;
  const int kvh = blockIdx.x / p.head_chunks;
  const int chunk = blockIdx.x - kvh * p.head_chunks;
  const int row = p.query_start_loc[b];
  if (p.query_start_loc[b + 1] - row != 1) return;  // empty, or a prefill: not ours
  const int h0 = kvh * p.group + chunk * GMAX;       // first query head of this block
  const int ng = min(GMAX, p.group - chunk * GMAX);  // query heads of this block
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int slot = lane / LPT;  // which token row of the warp's step
  const int dl = lane % LPT;    // which 8 dimensions of it

  T* out_row = static_cast<T*>(p.out) + static_cast<int64_t>(row) * p.out_stride;
  const int seq_len = p.seq_lens[b];
  if (seq_len <= 0) {  // padding row of a fixed-size (graph) batch: zeros
    if (z == 0) {
      for (int i = tid; i < ng * LPT; i += kThreads) {
        *reinterpret_cast<uint4*>(out_row + (h0 + i / LPT) * D + (i % LPT) * 8) =
            make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
  // The context read: [ctx0, seq_len), the whole context or the window.
  const int ctx0 = window_start(seq_len - 1, p.window);
  const int chunk_len = split_chunk_len(seq_len - ctx0, p.splits);
  const int used = (seq_len - ctx0 + chunk_len - 1) / chunk_len;  // splits this sequence uses
  if (z >= used) return;
  const int c0 = ctx0 + z * chunk_len;
  const int c1 = min(seq_len, c0 + chunk_len);

  // This thread's 8 dimensions of each query head, kept packed (4 registers a
  // head instead of 8: registers bound the number of resident blocks, which
  // bounds the loads in flight).
  uint4 q[GMAX];
  {
    const T* qp = static_cast<const T*>(p.query) + static_cast<int64_t>(row) * p.query_stride +
                  h0 * D + dl * 8;
#pragma unroll
    for (int g = 0; g < GMAX; ++g) q[g] = g < ng ? load16(qp + g * D) : make_uint4(0, 0, 0, 0);
  }

  float acc[GMAX][8];
  float run_max[GMAX];
  float run_sum[GMAX];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    run_max[g] = -FLT_MAX;
    run_sum[g] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
  }

  const int64_t head_off = static_cast<int64_t>(kvh) * D + dl * 8;
  const T* kc = static_cast<const T*>(p.key_cache) + head_off;
  const T* vc = static_cast<const T*>(p.value_cache) + head_off;
  const int32_t* table = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  const int log2_bs = p.log2_block_size;
  const int bs_mask = (1 << log2_bs) - 1;

  for (int s0 = c0; s0 < c1; s0 += kPartition) {
    const int n = min(kPartition, c1 - s0);
    const int first = s0 >> log2_bs;
    const int nb = ((s0 + n - 1) >> log2_bs) - first + 1;
    for (int i = tid; i < nb; i += kThreads) blocks[i] = table[first + i];
    __syncthreads();

    // 1. scores of the partition's tokens.
    for (int base = 0; base < n; base += ROWS * kUnroll) {
      uint4 kraw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int r = base + u * ROWS + warp * TPW + slot;
        if (r < n) {
          const int pos = s0 + r;
          const int64_t blk = blocks[(pos >> log2_bs) - first];
          kraw[u] = load16(kc + blk * p.block_stride + (pos & bs_mask) * p.token_stride);
        } else {
          kraw[u] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int r = base + u * ROWS + warp * TPW + slot;
        float k[8];
        unpack8<T>(kraw[u], k);
        float s[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; ++g) s[g] = dot8<T>(q[g], k);
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1) {
#pragma unroll
          for (int g = 0; g < GMAX; ++g) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
        }
        if (dl == 0 && r < n) {
#pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            if (g < ng) scores[g * kPartition + r] = s[g] * p.scale_log2;
          }
        }
      }
    }
    __syncthreads();

    // 2. partition maximum, new running maximum, exp2 and sums.
    float m[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) m[g] = -FLT_MAX;
    for (int r = tid; r < n; r += kThreads) {
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        if (g < ng) m[g] = fmaxf(m[g], scores[g * kPartition + r]);
      }
    }
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      m[g] = warp_max(m[g]);
      if (lane == 0) red_max[warp][g] = m[g];
    }
    __syncthreads();
    float alpha[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      float mm = red_max[0][g];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) mm = fmaxf(mm, red_max[w][g]);
      const float new_max = fmaxf(run_max[g], mm);
      alpha[g] = exp2f(run_max[g] - new_max);  // 0 on the first partition
      run_max[g] = new_max;
    }
    float part_sum[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; ++g) part_sum[g] = 0.f;
    for (int r = tid; r < n; r += kThreads) {
#pragma unroll
      for (int g = 0; g < GMAX; ++g) {
        if (g < ng) {
          const float e = exp2f(scores[g * kPartition + r] - run_max[g]);
          scores[g * kPartition + r] = e;
          part_sum[g] += e;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      part_sum[g] = warp_sum(part_sum[g]);
      if (lane == 0) red_sum[warp][g] = part_sum[g];
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      float ss = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) ss += red_sum[w][g];
      run_sum[g] = run_sum[g] * alpha[g] + ss;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] *= alpha[g];
    }

    // 3. acc += p * v.
    for (int base = 0; base < n; base += ROWS * kUnroll) {
      uint4 vraw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int r = base + u * ROWS + warp * TPW + slot;
        if (r < n) {
          const int pos = s0 + r;
          const int64_t blk = blocks[(pos >> log2_bs) - first];
          vraw[u] = load16(vc + blk * p.block_stride + (pos & bs_mask) * p.token_stride);
        } else {
          vraw[u] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int r = base + u * ROWS + warp * TPW + slot;
        if (r < n) {
          float v[8];
          unpack8<T>(vraw[u], v);
#pragma unroll
          for (int g = 0; g < GMAX; ++g) {
            if (g < ng) {
              const float pr = scores[g * kPartition + r];
#pragma unroll
              for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(pr, v[j], acc[g][j]);
            }
          }
        }
      }
    }
    __syncthreads();  // scores and blocks are rewritten next
  }

  // Sum the token slots of each warp (same dimensions, different tokens) ...
#pragma unroll
  for (int off = LPT; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], off);
    }
  }
  // ... then the warps, through shared memory.
  float* red = scores;  // [kWarps][GMAX][D]
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      if (g < ng) {
        float4* dst = reinterpret_cast<float4*>(red + (warp * GMAX + g) * D + dl * 8);
        dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
      }
    }
  }
  if (tid == 0) {
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      fin_max[g] = run_max[g];
      fin_sum[g] = run_sum[g];
    }
  }
  __syncthreads();
  for (int i = tid; i < ng * LPT; i += kThreads) {
    const int g = i / LPT;
    const int c = i - g * LPT;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4* src = reinterpret_cast<const float4*>(red + (w * GMAX + g) * D + c * 8);
      const float4 a = src[0];
      const float4 bb = src[1];
      o[0] += a.x; o[1] += a.y; o[2] += a.z; o[3] += a.w;
      o[4] += bb.x; o[5] += bb.y; o[6] += bb.z; o[7] += bb.w;
    }
    const int h = h0 + g;
    // Split partials stay normalised over their keys alone; the reduction adds the sink.
    const float inv = p.sinks && used == 1
                          ? sink_scale(fin_sum[g], fin_max[g], p.sinks[h] * kLog2e)
                          : 1.f / fin_sum[g];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] *= inv;
    if (used == 1) {
      *reinterpret_cast<uint4*>(out_row + h * D + c * 8) = pack8<T>(o);
    } else {
      const int64_t part = (static_cast<int64_t>(b) * p.num_heads + h) * p.splits + z;
      float4* dst = reinterpret_cast<float4*>(p.part_out + part * D + c * 8);
      dst[0] = make_float4(o[0], o[1], o[2], o[3]);
      dst[1] = make_float4(o[4], o[5], o[6], o[7]);
      if (c == 0) {
        p.part_max[part] = fin_max[g];
        p.part_sum[part] = fin_sum[g];
      }
    }
  }
}

// Merges the splits of one (sequence, query head): D threads, one dimension each.
template <typename T, int D>
__global__ void __launch_bounds__(D) decode_reduce_kernel(const DecodeParams p) {
  static_assert(kMaxSplits <= 32, "one warp weighs the splits");
  __shared__ float weight[kMaxSplits];
  const int h = blockIdx.x;
  const int b = blockIdx.y;
  const int row = p.query_start_loc[b];
  if (p.query_start_loc[b + 1] - row != 1) return;
  const int seq_len = p.seq_lens[b];
  if (seq_len <= 0) return;
  const int ctx_len = seq_len - window_start(seq_len - 1, p.window);
  const int chunk_len = split_chunk_len(ctx_len, p.splits);
  const int used = (ctx_len + chunk_len - 1) / chunk_len;
  if (used <= 1) return;  // the attention kernel wrote out directly
  const int64_t base = (static_cast<int64_t>(b) * p.num_heads + h) * p.splits;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const float m = lane < used ? p.part_max[base + lane] : -FLT_MAX;
    float global_max = warp_max(m);
    float sink_w = 0.f;  // the sink's term of the total (zero value: no output term)
    if (p.sinks) {
      const float sink2 = p.sinks[h] * kLog2e;
      global_max = fmaxf(global_max, sink2);
      sink_w = exp2f(sink2 - global_max);
    }
    const float w = lane < used ? p.part_sum[base + lane] * exp2f(m - global_max) : 0.f;
    const float total = warp_sum(w) + sink_w;
    if (lane < used) weight[lane] = w / total;
  }
  __syncthreads();
  const int d = threadIdx.x;
  float acc = 0.f;
  for (int s = 0; s < used; ++s) acc = fmaf(weight[s], p.part_out[(base + s) * D + d], acc);
  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(row) * p.out_stride + h * D + d;
  *out = Pack<T>::from_float(acc);
}

template <typename T, int D, int GMAX>
cudaError_t launch_typed(const DecodeParams& p, int num_seqs, int num_kv_heads,
                         cudaStream_t stream) {
  const dim3 grid(num_kv_heads * p.head_chunks, num_seqs, p.splits);
  paged_decode_kernel<T, D, GMAX><<<grid, kThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.splits <= 1) return err;
  decode_reduce_kernel<T, D><<<dim3(p.num_heads, num_seqs), D, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t launch_gmax(const DecodeParams& p, int gmax, int num_seqs, int num_kv_heads,
                        cudaStream_t stream) {
  switch (gmax) {
    case 1: return launch_typed<T, D, 1>(p, num_seqs, num_kv_heads, stream);
    case 2: return launch_typed<T, D, 2>(p, num_seqs, num_kv_heads, stream);
    case 4: return launch_typed<T, D, 4>(p, num_seqs, num_kv_heads, stream);
    default: return launch_typed<T, D, 8>(p, num_seqs, num_kv_heads, stream);
  }
}

template <typename T>
cudaError_t launch_dim(const DecodeParams& p, int head_size, int gmax, int num_seqs,
                       int num_kv_heads, cudaStream_t stream) {
  switch (head_size) {
    case 64: return launch_gmax<T, 64>(p, gmax, num_seqs, num_kv_heads, stream);
    case 128: return launch_gmax<T, 128>(p, gmax, num_seqs, num_kv_heads, stream);
    default: return launch_gmax<T, 256>(p, gmax, num_seqs, num_kv_heads, stream);
  }
}

}  // namespace

cudaError_t launch_decode(const DecodeParams& p, int dtype, int head_size, int gmax,
                          int num_seqs, int num_kv_heads, cudaStream_t stream) {
  if (dtype == static_cast<int>(DType::kFloat16)) {
    return launch_dim<__half>(p, head_size, gmax, num_seqs, num_kv_heads, stream);
  }
  return launch_dim<__nv_bfloat16>(p, head_size, gmax, num_seqs, num_kv_heads, stream);
}

}  // namespace detail
}  // namespace cuda
}  // namespace paternoster
