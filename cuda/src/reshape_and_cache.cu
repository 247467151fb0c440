// reshape_and_cache: copy this step's K/V rows into their paged-cache slots.
// One thread block per token; each thread moves 16 bytes (or 4 bytes when the
// rows are not 16-byte multiples) of the key row and of the value row.
#include "common.cuh"

namespace paternoster {
namespace cuda {
namespace detail {

namespace {

template <typename V>
__global__ void __launch_bounds__(256)
    reshape_and_cache_kernel(const char* __restrict__ key, const char* __restrict__ value,
                             char* __restrict__ key_cache, char* __restrict__ value_cache,
                             const int64_t* __restrict__ slot_mapping, int64_t key_stride_bytes,
                             int64_t value_stride_bytes, int64_t row_bytes, int64_t num_slots) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const V* k = reinterpret_cast<const V*>(key + t * key_stride_bytes);
  const V* v = reinterpret_cast<const V*>(value + t * value_stride_bytes);
  V* kd = reinterpret_cast<V*>(key_cache + slot * row_bytes);
  V* vd = reinterpret_cast<V*>(value_cache + slot * row_bytes);
  const int n = static_cast<int>(row_bytes / sizeof(V));
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    kd[i] = k[i];
    vd[i] = v[i];
  }
}

template <typename V>
cudaError_t launch(const CacheWriteArgs& a, int64_t key_stride_bytes, int64_t value_stride_bytes,
                   int64_t row_bytes, cudaStream_t stream) {
  const int64_t n = row_bytes / static_cast<int64_t>(sizeof(V));
  const int threads = static_cast<int>(n >= 256 ? 256 : ((n + 31) / 32) * 32);
  reshape_and_cache_kernel<V><<<static_cast<unsigned>(a.num_tokens), threads, 0, stream>>>(
      static_cast<const char*>(a.key), static_cast<const char*>(a.value),
      static_cast<char*>(a.key_cache), static_cast<char*>(a.value_cache), a.slot_mapping,
      key_stride_bytes, value_stride_bytes, row_bytes, a.num_slots);
  return cudaGetLastError();
}

}  // namespace

// Sizes validated by the caller (attention_api.cc).
cudaError_t launch_reshape_and_cache(const CacheWriteArgs& a, cudaStream_t stream) {
  const int64_t elem = 2;
  const int64_t row_bytes = a.num_kv_heads * a.head_size * elem;
  const int64_t ks = a.key_stride * elem;
  const int64_t vs = a.value_stride * elem;
  const auto aligned = [](const void* ptr, int64_t n) {
    return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(n) == 0;
  };
  const bool wide = row_bytes % 16 == 0 && ks % 16 == 0 && vs % 16 == 0 && aligned(a.key, 16) &&
                    aligned(a.value, 16) && aligned(a.key_cache, 16) &&
                    aligned(a.value_cache, 16);
  if (wide) return launch<uint4>(a, ks, vs, row_bytes, stream);
  return launch<uint32_t>(a, ks, vs, row_bytes, stream);
}

}  // namespace detail
}  // namespace cuda
}  // namespace paternoster
