// Host side of the CUDA attention API: argument checks, the split-K plan and
// dispatch to the kernel launchers. Nothing here reads device memory or
// allocates, so every entry point can be recorded into a CUDA graph.
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "paternoster/cuda_attention.h"

namespace paternoster {
namespace cuda {

namespace {

// Thread blocks per multiprocessor the split count aims for: several resident
// blocks (128 threads each) per SM, times a few waves so the tail stays short.
constexpr int64_t kTargetBlocksPerSm = 16;
constexpr int64_t kPrefillRows = 64;  // rows of a prefill thread block (prefill_attention.cu)
constexpr int64_t kMaxGridYZ = 65535;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void require_positive(int64_t v, const char* name) {
  if (v <= 0) fail(std::string(name) + " must be > 0, got " + std::to_string(v));
}

void require_aligned(const void* p, const char* name) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    fail(std::string(name) + " must be 16-byte aligned");
  }
}

void require_head_size(int64_t d) {
  if (d != 64 && d != 128 && d != 256) {
    fail("head_size must be 64, 128 or 256 for the CUDA attention kernels, got " +
         std::to_string(d));
  }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return (int64_t{1} << l) == v ? l : -1;
}

// Query heads one decode thread block handles (template GMAX of the kernel).
int64_t decode_gmax(int64_t group) {
  if (group <= 1) return 1;
  if (group <= 2) return 2;
  if (group <= 4) return 4;
  return 8;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Multiprocessors of the current device, cached per device.
cudaError_t current_num_sms(int* out) {
  static std::atomic<int> cache[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < 64) {
    const int cached = cache[dev].load(std::memory_order_relaxed);
    if (cached > 0) {
      *out = cached;
      return cudaSuccess;
    }
  }
  int n = 0;
  err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  *out = n;
  return cudaSuccess;
}

int64_t split_bytes(int64_t num_seqs, int64_t num_heads, int64_t head_size) {
  return num_seqs * num_heads * (head_size + 2) * static_cast<int64_t>(sizeof(float));
}

}  // namespace

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  fail("unknown dtype " + std::to_string(static_cast<int>(dtype)) +
       " (the CUDA kernels take float16 or bfloat16)");
}

int64_t decode_num_splits(int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                          int64_t max_seq_len, int64_t num_sms) {
  require_positive(num_seqs, "num_seqs");
  require_positive(num_heads, "num_heads");
  require_positive(num_kv_heads, "num_kv_heads");
  require_positive(max_seq_len, "max_seq_len");
  require_positive(num_sms, "num_sms");
  if (num_heads % num_kv_heads != 0) fail("num_heads must be a multiple of num_kv_heads");
  if (max_seq_len <= kMinSplitTokens) return 1;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t blocks = num_seqs * num_kv_heads * ceil_div(group, decode_gmax(group));
  const int64_t target = num_sms * kTargetBlocksPerSm;
  if (blocks >= target) return 1;
  int64_t splits = ceil_div(target, blocks);
  splits = std::min(splits, kMaxSplits);
  splits = std::min(splits, ceil_div(max_seq_len, kMinSplitTokens));
  return std::max<int64_t>(splits, 1);
}

int64_t decode_workspace_bytes(int64_t max_num_seqs, int64_t num_heads, int64_t num_kv_heads,
                               int64_t head_size, int64_t max_seq_len, int64_t num_sms) {
  require_positive(max_num_seqs, "max_num_seqs");
  if (max_num_seqs > kMaxGridYZ) fail("max_num_seqs must be <= 65535 (num_seqs of one call)");
  require_head_size(head_size);
  int64_t best = 0;
  for (int64_t b = 1; b <= max_num_seqs; ++b) {
    const int64_t z = decode_num_splits(b, num_heads, num_kv_heads, max_seq_len, num_sms);
    if (z > 1) best = std::max(best, z * split_bytes(b, num_heads, head_size));
  }
  return best;
}

namespace {

// Checked copy of reshape_and_cache()'s arguments with the default strides filled in.
CacheWriteArgs resolve(const CacheWriteArgs& a) {
  dtype_size(a.dtype);
  if (a.num_tokens < 0) fail("num_tokens must be >= 0");
  require_positive(a.num_kv_heads, "num_kv_heads");
  require_positive(a.head_size, "head_size");
  if (a.head_size % 2 != 0) fail("head_size must be even");
  if (a.num_slots < 0) fail("num_slots must be >= 0");
  if (a.num_tokens > 0x7fffffff) fail("num_tokens must be < 2^31");
  const int64_t row = a.num_kv_heads * a.head_size;
  CacheWriteArgs args = a;
  if (args.key_stride == 0) args.key_stride = row;
  if (args.value_stride == 0) args.value_stride = row;
  if (args.key_stride < row || args.key_stride % 2 != 0) {
    fail("key_stride must be even and >= num_kv_heads * head_size (" + std::to_string(row) +
         "), got " + std::to_string(args.key_stride));
  }
  if (args.value_stride < row || args.value_stride % 2 != 0) {
    fail("value_stride must be even and >= num_kv_heads * head_size (" + std::to_string(row) +
         "), got " + std::to_string(args.value_stride));
  }
  if (args.num_tokens == 0) return args;
  if (!a.key || !a.value || !a.key_cache || !a.value_cache || !a.slot_mapping) {
    fail("key, value, key_cache, value_cache and slot_mapping must not be null");
  }
  for (const void* p : {a.key, a.value, static_cast<const void*>(a.key_cache),
                        static_cast<const void*>(a.value_cache)}) {
    if (reinterpret_cast<uintptr_t>(p) % 4 != 0) {
      fail("key, value, key_cache and value_cache must be 4-byte aligned");
    }
  }
  return args;
}

// Checked copy of paged_attention()'s arguments with the defaults (strides,
// max_query_len, max_seq_len) filled in.
PagedAttentionArgs resolve(const PagedAttentionArgs& a) {
  dtype_size(a.dtype);
  require_head_size(a.head_size);
  require_positive(a.num_heads, "num_heads");
  require_positive(a.num_kv_heads, "num_kv_heads");
  if (a.num_heads % a.num_kv_heads != 0) {
    fail("num_heads (" + std::to_string(a.num_heads) + ") must be a multiple of num_kv_heads (" +
         std::to_string(a.num_kv_heads) + ")");
  }
  if (a.block_size < 8 || a.block_size > (1 << 20) || log2_exact(a.block_size) < 0) {
    fail("block_size must be a power of two >= 8 for the CUDA kernels, got " +
         std::to_string(a.block_size));
  }
  if (a.num_tokens < 0 || a.num_tokens > 0x7fffffff) fail("num_tokens must be in [0, 2^31)");
  if (a.num_seqs < 0 || a.num_seqs > kMaxGridYZ) fail("num_seqs must be in [0, 65535]");
  if (a.num_blocks < 0) fail("num_blocks must be >= 0");
  if (a.max_blocks_per_seq < 0 || a.max_blocks_per_seq > 0x7fffffff) {
    fail("max_blocks_per_seq must be in [0, 2^31)");
  }
  const int64_t group = a.num_heads / a.num_kv_heads;
  if (a.num_kv_heads * ceil_div(group, std::min(group, kPrefillRows)) > kMaxGridYZ) {
    fail("too many kv heads for the prefill grid (num_kv_heads must be < 65536)");
  }
  PagedAttentionArgs r = a;
  const int64_t row = a.num_heads * a.head_size;
  if (r.query_stride == 0) r.query_stride = row;
  if (r.out_stride == 0) r.out_stride = row;
  if (r.query_stride < row || r.query_stride % 8 != 0) {
    fail("query_stride must be a multiple of 8 and >= num_heads * head_size");
  }
  if (r.out_stride < row || r.out_stride % 8 != 0) {
    fail("out_stride must be a multiple of 8 and >= num_heads * head_size");
  }
  if (r.max_query_len == 0) r.max_query_len = a.num_tokens;
  if (r.max_query_len < 0 || r.max_query_len > a.num_tokens) {
    fail("max_query_len must be in [0, num_tokens]");
  }
  if (r.max_seq_len == 0) r.max_seq_len = a.max_blocks_per_seq * a.block_size;
  if (r.max_seq_len < 0) fail("max_seq_len must be >= 0");
  if (r.max_seq_len == 0) r.max_seq_len = 1;
  if (r.workspace_bytes < 0) fail("workspace_bytes must be >= 0");
  if (a.sliding_window < 0) {
    fail("sliding_window must be >= 0 (0 = no window), got " + std::to_string(a.sliding_window));
  }
  if (a.num_seqs == 0 || a.num_tokens == 0 || r.max_query_len == 0) return r;
  if (!a.out || !a.query || !a.key_cache || !a.value_cache || !a.block_tables || !a.seq_lens ||
      !a.query_start_loc) {
    fail("out, query, key_cache, value_cache, block_tables, seq_lens and query_start_loc "
         "must not be null");
  }
  require_aligned(a.out, "out");
  require_aligned(a.query, "query");
  require_aligned(a.key_cache, "key_cache");
  require_aligned(a.value_cache, "value_cache");
  if (a.workspace && reinterpret_cast<uintptr_t>(a.workspace) % 16 != 0) {
    fail("workspace must be 16-byte aligned");
  }
  if (reinterpret_cast<uintptr_t>(a.sinks) % alignof(float) != 0) {
    fail("sinks must be 4-byte aligned");
  }
  return r;
}

}  // namespace

void check_cache_write_args(const CacheWriteArgs& args) { resolve(args); }

void check_paged_attention_args(const PagedAttentionArgs& args) { resolve(args); }

cudaError_t reshape_and_cache(const CacheWriteArgs& args, cudaStream_t stream) {
  const CacheWriteArgs a = resolve(args);
  if (a.num_tokens == 0) return cudaSuccess;
  return detail::launch_reshape_and_cache(a, stream);
}

cudaError_t paged_attention(const PagedAttentionArgs& args, cudaStream_t stream) {
  const PagedAttentionArgs a = resolve(args);
  if (a.num_seqs == 0 || a.num_tokens == 0 || a.max_query_len == 0) return cudaSuccess;
  const int log2_bs = log2_exact(a.block_size);
  const int64_t query_stride = a.query_stride;
  const int64_t out_stride = a.out_stride;
  const int64_t max_query_len = a.max_query_len;
  // A window shortens every context a decode reads (and so its splits).
  const int64_t max_seq_len =
      a.sliding_window > 0 ? std::min(a.max_seq_len, a.sliding_window) : a.max_seq_len;
  // Windows beyond any int position are no window.
  const int window = static_cast<int>(std::min<int64_t>(a.sliding_window, 0x7fffffff));
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t token_stride = a.num_kv_heads * a.head_size;
  const int64_t block_stride = a.block_size * token_stride;
  const float scale_log2 = a.scale * detail::kLog2e;

  // Decode rows (q_len == 1): always launched, they skip everything else.
  int num_sms = a.num_sms;
  if (num_sms <= 0) {
    const cudaError_t err = current_num_sms(&num_sms);
    if (err != cudaSuccess) return err;
  }
  int64_t splits = decode_num_splits(a.num_seqs, a.num_heads, a.num_kv_heads, max_seq_len,
                                     num_sms);
  const int64_t per_split = split_bytes(a.num_seqs, a.num_heads, a.head_size);
  if (splits > 1) {
    const int64_t fit = a.workspace ? a.workspace_bytes / per_split : 0;
    splits = std::min(splits, fit);
    if (splits < 2) splits = 1;
  }
  const int64_t gmax = decode_gmax(group);
  detail::DecodeParams d{};
  d.out = a.out;
  d.query = a.query;
  d.key_cache = a.key_cache;
  d.value_cache = a.value_cache;
  d.block_tables = a.block_tables;
  d.seq_lens = a.seq_lens;
  d.query_start_loc = a.query_start_loc;
  if (splits > 1) {
    const int64_t parts = a.num_seqs * a.num_heads * splits;
    d.part_out = static_cast<float*>(a.workspace);
    d.part_max = d.part_out + parts * a.head_size;
    d.part_sum = d.part_max + parts;
  }
  d.query_stride = query_stride;
  d.out_stride = out_stride;
  d.block_stride = block_stride;
  d.token_stride = token_stride;
  d.max_blocks_per_seq = static_cast<int>(a.max_blocks_per_seq);
  d.num_heads = static_cast<int>(a.num_heads);
  d.group = static_cast<int>(group);
  d.head_chunks = static_cast<int>(ceil_div(group, gmax));
  d.log2_block_size = log2_bs;
  d.splits = static_cast<int>(splits);
  d.window = window;
  d.scale_log2 = scale_log2;
  d.sinks = a.sinks;
  cudaError_t err = detail::launch_decode(d, static_cast<int>(a.dtype),
                                          static_cast<int>(a.head_size), static_cast<int>(gmax),
                                          static_cast<int>(a.num_seqs),
                                          static_cast<int>(a.num_kv_heads), stream);
  if (err != cudaSuccess || max_query_len <= 1) return err;

  // Prefill rows (q_len > 1).
  detail::PrefillParams f{};
  f.out = a.out;
  f.query = a.query;
  f.key_cache = a.key_cache;
  f.value_cache = a.value_cache;
  f.block_tables = a.block_tables;
  f.seq_lens = a.seq_lens;
  f.query_start_loc = a.query_start_loc;
  f.query_stride = query_stride;
  f.out_stride = out_stride;
  f.block_stride = block_stride;
  f.token_stride = token_stride;
  f.max_blocks_per_seq = static_cast<int>(a.max_blocks_per_seq);
  f.group = static_cast<int>(group);
  f.heads_per_chunk = static_cast<int>(std::min(group, kPrefillRows));
  f.head_chunks = static_cast<int>(ceil_div(group, f.heads_per_chunk));
  f.tile_tokens = static_cast<int>(kPrefillRows / f.heads_per_chunk);
  f.log2_block_size = log2_bs;
  f.window = window;
  f.scale_log2 = scale_log2;
  f.sinks = a.sinks;
  return detail::launch_prefill(f, static_cast<int>(a.dtype), static_cast<int>(a.head_size),
                                static_cast<int>(a.num_seqs), static_cast<int>(a.num_kv_heads),
                                static_cast<int>(max_query_len), stream);
}

}  // namespace cuda
}  // namespace paternoster
