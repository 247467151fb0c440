// Paged attention for prefill: sequences with more than one new token (whole
// prompts and prefill chunks over cached context).
//
// Thread block = (tile of query tokens of sequence b, kv head, chunk of the
// GQA group's query heads). Its 64 rows are (query token x query head) pairs
// of one kv head, so one K/V tile serves the whole group. Keys stream through
// shared memory in tiles of 32 tokens read through the block table; per tile:
// S = Q K^T on CUDA cores (each thread a 4 rows x 4 keys micro-tile),
// causal (and sliding-window) mask, FlashAttention's online softmax (Dao et
// al., 2022: running row maximum and sum, rescale the accumulator when the
// maximum grows), then O += P V (each thread 4 rows x D/8 dimensions). fp32
// accumulation. With a window the key tiles start at the first key the tile's
// first query sees, so blocks wholly before it are never read. An attention
// sink (a per-head logit in the normalisation, no value) enters in the
// epilogue, once per row.
// Simple rather than peak-FLOP (no tensor cores): decode, which dominates
// serving, has its own kernel; the paging follows PagedAttention (Kwon et al.,
// SOSP'23).
//
// Shared memory rows of Q and K are padded by one 32-bit word, so the 8 lanes
// that read different keys (or the 4 row groups of a warp that read different
// query rows) hit different banks.
//
// Budget (one tiling for D = 64, 128 and 256: 64 rows x 32 keys, 128 threads).
// Shared memory, dynamic (PrefillSmem below): Q 64 x (D/2 + 1) words, K 32 x
// (D/2 + 1) words, V 32 x D/2 words, P 64 x 33 floats:
//   D =  64: 24.6 KiB   D = 128: 40.6 KiB   D = 256: 72.6 KiB (74,368 bytes).
// Above 48 KiB a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize,
// set by the launcher): an H100/H200 allows 227 KiB per block and holds 3 such
// blocks per SM (228 KiB), an A100 (sm_80, 163 KiB per block) 2.
// Registers per thread: the 4 x D/8 fp32 output accumulators (32 / 64 / 128
// registers) dominate. ptxas (CUDA 13.0, sm_90, -O3): 95 / 127 / 211
// registers for D = 64 / 128 / 256, no spills; at D = 256 that is 2 blocks
// (8 warps) per SM (65536 registers / (128 threads x 216 allocated)), fewer
// than the shared memory allows. A cap of 168 registers (3 blocks,
// __launch_bounds__(kThreads, 3)) spills 208 bytes per thread, so none is set.
// Keys per tile stay 32 for every D: 16 would save 20 KiB of shared memory at
// D = 256 but no occupancy (the registers bound it) and double the barriers
// per key.
#include <cfloat>

#include "common.cuh"

namespace paternoster {
namespace cuda {
namespace detail {

namespace {

constexpr int kThreads = 128;
constexpr int kRows = 64;  // (query token, head) rows per block
constexpr int kKeys = 32;  // keys per tile
static_assert(kThreads == 2 * kRows, "thread (rg, kg) layout: 16 row groups x 8 key groups");
// Dynamic shared memory a kernel may use without opting in.
constexpr int kDefaultSmemBytes = 48 * 1024;

// The dynamic shared memory of a thread block for head size D, in 32-bit
// words: V first (16-byte stores), then Q, K (padded rows) and P.
template <int D>
struct PrefillSmem {
  static constexpr int QW = D / 2 + 1;  // 32-bit words per padded Q / K row
  static constexpr int VW = D / 2;      // words per V row
  static constexpr int PW = kKeys + 1;  // floats per padded P row
  static constexpr int kV = 0;
  static constexpr int kQ = kV + kKeys * VW;
  static constexpr int kK = kQ + kRows * QW;
  static constexpr int kP = kK + kKeys * QW;
  static constexpr int kWords = kP + kRows * PW;
  static constexpr int kBytes = kWords * 4;
  static_assert(D % 16 == 0, "8 key groups x 16-byte chunks of a row");
  static_assert(kBytes <= 227 * 1024, "fits an H100/H200 thread block (227 KiB opt-in)");
};

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(const PrefillParams p) {
  using Smem = PrefillSmem<D>;
  constexpr int QW = Smem::QW;
  constexpr int VW = Smem::VW;
  constexpr int PW = Smem::PW;
  constexpr int OW = D / 16;      // output word pairs per thread (2 dims each)
  constexpr int CPR = D / 8;      // 16-byte chunks per row
  extern __shared__ __align__(16) uint32_t smem[];  // Smem::kBytes, see the launcher
  uint32_t* const v_s = smem + Smem::kV;                          // [kKeys][VW]
  uint32_t* const q_s = smem + Smem::kQ;                          // [kRows][QW]
  uint32_t* const k_s = smem + Smem::kK;                          // [kKeys][QW]
  float* const p_s = reinterpret_cast<float*>(smem + Smem::kP);  // [kRows][PW]

  const int b = blockIdx.y;
  const int kvh = blockIdx.z / p.head_chunks;
  const int chunk = blockIdx.z - kvh * p.head_chunks;
  const int q0 = p.query_start_loc[b];
  const int q_len = p.query_start_loc[b + 1] - q0;
  if (q_len <= 1) return;  // empty, or a decode (the decode kernel's)
  const int t0 = blockIdx.x * p.tile_tokens;
  if (t0 >= q_len) return;
  const int seq_len = p.seq_lens[b];
  const int ctx0 = seq_len - q_len;  // position of query token 0
  const int nt = min(p.tile_tokens, q_len - t0);
  const int hc = p.heads_per_chunk;
  const int ng = min(hc, p.group - chunk * hc);
  const int h0 = kvh * p.group + chunk * hc;
  const int kv_end = ctx0 + t0 + nt;  // keys [kv_begin, kv_end) are visible to some row
  const int kv_begin = window_start(ctx0 + t0, p.window);  // 0 without a window
  const int tid = threadIdx.x;

  // Q tile -> shared memory (zeros for rows without a query).
  const T* qbase = static_cast<const T*>(p.query);
  for (int i = tid; i < kRows * CPR; i += kThreads) {
    const int r = i / CPR;
    const int c = i - r * CPR;
    const int tq = r / hc;
    const int g = r - tq * hc;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tq < nt && g < ng) {
      v = load16(qbase + static_cast<int64_t>(q0 + t0 + tq) * p.query_stride +
                 (h0 + g) * D + c * 8);
    }
    uint32_t* dst = q_s + r * QW + c * 4;
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  }

  const int rg = tid >> 3;  // rows rg + 16 i
  const int kg = tid & 7;   // keys kg + 8 j; output word pairs kg + 8 j
  int qpos[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) qpos[i] = ctx0 + t0 + (rg + 16 * i) / hc;
  float o[4][2 * OW];
  float m[4];
  float l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -FLT_MAX;
    l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < 2 * OW; ++c) o[i][c] = 0.f;
  }

  const int32_t* table = p.block_tables + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  const int log2_bs = p.log2_block_size;
  const int bs_mask = (1 << log2_bs) - 1;
  const int64_t head_off = static_cast<int64_t>(kvh) * D;
  const T* kc = static_cast<const T*>(p.key_cache) + head_off;
  const T* vc = static_cast<const T*>(p.value_cache) + head_off;

  for (int k0 = kv_begin; k0 < kv_end; k0 += kKeys) {
    // K/V tile -> shared memory; zeros past kv_end (their P is 0, and 0 * garbage
    // could be NaN).
    for (int i = tid; i < kKeys * CPR; i += kThreads) {
      const int kk = i / CPR;
      const int c = i - kk * CPR;
      const int pos = k0 + kk;
      uint4 kv = make_uint4(0, 0, 0, 0);
      uint4 vv = make_uint4(0, 0, 0, 0);
      if (pos < kv_end) {
        const int64_t off = static_cast<int64_t>(table[pos >> log2_bs]) * p.block_stride +
                            (pos & bs_mask) * p.token_stride + c * 8;
        kv = load16(kc + off);
        vv = load16(vc + off);
      }
      uint32_t* kd = k_s + kk * QW + c * 4;
      kd[0] = kv.x; kd[1] = kv.y; kd[2] = kv.z; kd[3] = kv.w;
      *reinterpret_cast<uint4*>(v_s + kk * VW + c * 4) = vv;
    }
    __syncthreads();

    // S = Q K^T for rows rg + 16 i and keys kg + 8 j.
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
    }
#pragma unroll 8
    for (int w = 0; w < D / 2; ++w) {
      float2 qf[4];
      float2 kf[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qf[i] = Pack<T>::to_float2(q_s[(rg + 16 * i) * QW + w]);
#pragma unroll
      for (int j = 0; j < 4; ++j) kf[j] = Pack<T>::to_float2(k_s[(kg + 8 * j) * QW + w]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[i][j] = fmaf(qf[i].x, kf[j].x, s[i][j]);
          s[i][j] = fmaf(qf[i].y, kf[j].y, s[i][j]);
        }
      }
    }

    // Causal mask, online softmax; the 8 lanes of a row group share each row.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -FLT_MAX;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int kpos = k0 + kg + 8 * j;
        const bool seen = kpos <= qpos[i] && kpos < kv_end &&
                          (p.window <= 0 || kpos > qpos[i] - p.window);
        s[i][j] = seen ? s[i][j] * p.scale_log2 : -FLT_MAX;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float new_max = fmaxf(m[i], mx);
      const float alpha = exp2f(m[i] - new_max);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // A masked key has p = 0 exactly, also while the row has seen nothing
        // else (new_max == -FLT_MAX): rows without a query, and with a window
        // rows whose window starts after this key tile.
        const float e = s[i][j] == -FLT_MAX ? 0.f : exp2f(s[i][j] - new_max);
        p_s[(rg + 16 * i) * PW + kg + 8 * j] = e;
        sum += e;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      l[i] = l[i] * alpha + sum;
      m[i] = new_max;
#pragma unroll
      for (int c = 0; c < 2 * OW; ++c) o[i][c] *= alpha;
    }
    __syncwarp();  // p_s rows of a row group are written and read by one warp

    // O += P V for rows rg + 16 i and dimension pairs kg + 8 j.
#pragma unroll 4
    for (int kk = 0; kk < kKeys; ++kk) {
      float pr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = p_s[(rg + 16 * i) * PW + kk];
#pragma unroll
      for (int j = 0; j < OW; ++j) {
        const float2 v = Pack<T>::to_float2(v_s[kk * VW + kg + 8 * j]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o[i][2 * j] = fmaf(pr[i], v.x, o[i][2 * j]);
          o[i][2 * j + 1] = fmaf(pr[i], v.y, o[i][2 * j + 1]);
        }
      }
    }
    __syncthreads();  // k_s, v_s and p_s are rewritten next
  }

  T* obase = static_cast<T*>(p.out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg + 16 * i;
    const int tq = r / hc;
    const int g = r - tq * hc;
    if (tq >= nt || g >= ng) continue;
    const float inv =
        p.sinks ? sink_scale(l[i], m[i], p.sinks[h0 + g] * kLog2e) : 1.f / l[i];
    uint32_t* dst = reinterpret_cast<uint32_t*>(
        obase + static_cast<int64_t>(q0 + t0 + tq) * p.out_stride + (h0 + g) * D);
#pragma unroll
    for (int j = 0; j < OW; ++j) {
      dst[kg + 8 * j] = Pack<T>::from_float2(o[i][2 * j] * inv, o[i][2 * j + 1] * inv);
    }
  }
}

template <typename T, int D>
cudaError_t launch_typed(const PrefillParams& p, int num_seqs, int num_kv_heads,
                         int max_query_len, cudaStream_t stream) {
  const dim3 grid((max_query_len + p.tile_tokens - 1) / p.tile_tokens, num_seqs,
                  num_kv_heads * p.head_chunks);
  constexpr int bytes = PrefillSmem<D>::kBytes;
  if (bytes > kDefaultSmemBytes) {
    // The opt-in is a per-device function attribute, so it is set on every
    // launch, as FlashAttention's launchers do (a host-side call that
    // enqueues nothing; the decode graphs never get here: max_query_len 1
    // launches no prefill).
    const cudaError_t err = cudaFuncSetAttribute(
        paged_prefill_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) return err;
  }
  paged_prefill_kernel<T, D><<<grid, kThreads, bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_dim(const PrefillParams& p, int head_size, int num_seqs, int num_kv_heads,
                       int max_query_len, cudaStream_t stream) {
  switch (head_size) {
    case 64: return launch_typed<T, 64>(p, num_seqs, num_kv_heads, max_query_len, stream);
    case 128: return launch_typed<T, 128>(p, num_seqs, num_kv_heads, max_query_len, stream);
    default: return launch_typed<T, 256>(p, num_seqs, num_kv_heads, max_query_len, stream);
  }
}

}  // namespace

cudaError_t launch_prefill(const PrefillParams& p, int dtype, int head_size, int num_seqs,
                           int num_kv_heads, int max_query_len, cudaStream_t stream) {
  if (dtype == static_cast<int>(DType::kFloat16)) {
    return launch_dim<__half>(p, head_size, num_seqs, num_kv_heads, max_query_len, stream);
  }
  return launch_dim<__nv_bfloat16>(p, head_size, num_seqs, num_kv_heads, max_query_len, stream);
}

}  // namespace detail
}  // namespace cuda
}  // namespace paternoster
